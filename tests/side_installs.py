"""What some interop tests run beside Keel, installed once per machine, outside the checkout.

LiteLLM, google-adk and fasta2a each get a venv of their own (their pins cannot move Keel's),
and the official AG-UI client a `node_modules` of its own. They live in a cache folder
(`$KEEL_TEST_CACHE`, else `$XDG_CACHE_HOME/keel-tests`, else `~/.cache/keel-tests`) under a
name made of what is in them (the packages and Python's version), so a clean checkout, which
is what CI tests, finds them made by an earlier run on the machine instead of spending minutes
installing them again; a change of version gets a folder of its own. A stamp written after a
complete install says one is ready; without it, the folder is made anew. When they cannot be
installed, the tests skip with pip's or npm's own error.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

__all__ = [
    "STAMP",
    "announce",
    "cache_folder",
    "install_venv",
    "npm_error",
    "npm_install",
    "npm_package",
    "pip_error",
    "private_venv",
]

INSTALL_TIMEOUT = 900.0
STAMP = ".installed"


def cache_folder(name: str, *contents: str) -> Path:
    """The folder of `name` holding `contents` (package specs, a manifest's digest)."""
    chosen = os.environ.get("KEEL_TEST_CACHE")
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    base = Path(chosen) if chosen else Path(cache) / "keel-tests"
    identity = "\n".join([sys.version, *contents]).encode()
    return base / f"{name}-{hashlib.sha256(identity).hexdigest()[:12]}"


@contextlib.contextmanager
def held(folder: Path) -> Iterator[None]:
    """The folder to oneself while it is made: a second test process (pytest-xdist's other
    worker) waits, then finds the stamp."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def announce(config: pytest.Config, line: str) -> None:
    """One line past pytest's capture: an install of a minute should not look like a hang."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():
            reporter.write_line(line)


def pip_error(stderr: str) -> str:
    """pip's own error lines, without its warnings about index locations."""
    lines = [line for line in stderr.splitlines() if line and not line.startswith("WARNING")]
    return " | ".join(lines[-4:]) or "no output"


def install_venv(
    venv: Path, packages: tuple[str, ...], env: dict[str, str] | None = None
) -> str | None:
    """A fresh venv at `venv` with `packages` installed: None, or why not (pip's own error)."""
    what = " ".join(packages)
    try:
        made = subprocess.run(
            [sys.executable, "-m", "venv", "--clear", str(venv)],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        if made.returncode != 0:
            return f"no venv for {what}: {pip_error(made.stderr)}"
        pip = subprocess.run(
            [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
             "--disable-pip-version-check", *packages],
            capture_output=True, text=True, timeout=INSTALL_TIMEOUT, env=env,
        )  # fmt: skip
    except subprocess.TimeoutExpired as timeout:
        return f"{what} did not install within {timeout.timeout:.0f} s"
    if pip.returncode != 0:
        return f"pip could not install {what}: {pip_error(pip.stderr)}"
    return None


def private_venv(config: pytest.Config, name: str, packages: tuple[str, ...]) -> Path:
    """The python of the venv `name` with `packages`, made when the cache lacks it; skips the
    test with pip's error when they cannot be installed."""
    venv = cache_folder(name, *packages)
    with held(venv):
        if not (venv / STAMP).exists():
            announce(config, f"installing {' '.join(packages)} into {venv} (once per machine)")
            failed = install_venv(venv, packages)
            if failed:
                pytest.skip(failed)
            (venv / STAMP).touch()
    return venv / "bin" / "python"


def npm_error(stderr: str) -> str:
    """npm's own error, its code and message lines (``npm error code ECONNREFUSED``, ...),
    without the stack, the object dump and the advice that follow."""
    said = [line.removeprefix("npm error").strip() for line in stderr.splitlines()]
    lines = [line for line in said if line and not line.startswith(("at ", "}"))]
    return " | ".join(lines[:4]) or stderr.strip()[-400:] or "no output"


def npm_install(
    source: Path, target: Path, package: str, env: dict[str, str] | None = None
) -> str | None:
    """The `package.json` in `source` installed into `target` by npm: None, or why not (npm's
    own error); `package` names what it installs in that message."""
    if shutil.which("npm") is None or shutil.which("node") is None:
        return f"node and npm are not installed: {package} cannot be installed"
    target.mkdir(parents=True, exist_ok=True)
    shutil.copy(source / "package.json", target / "package.json")
    try:
        npm = subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--no-package-lock"],
            cwd=target, capture_output=True, text=True, timeout=INSTALL_TIMEOUT, env=env,
        )  # fmt: skip
    except subprocess.TimeoutExpired as timeout:
        return f"npm did not install {package} within {timeout.timeout:.0f} s"
    if npm.returncode != 0:
        return f"npm could not install {package}: {npm_error(npm.stderr)}"
    return None


def npm_package(config: pytest.Config, name: str, source: Path, package: str) -> Path:
    """The folder holding `source`'s `package.json` installed (`node_modules` beside it), made
    when the cache lacks it; skips the test with npm's error when it cannot be installed."""
    digest = hashlib.sha256((source / "package.json").read_bytes()).hexdigest()
    folder = cache_folder(name, digest)
    with held(folder):
        if not (folder / STAMP).exists():
            announce(config, f"installing {package} into {folder} (once per machine)")
            failed = npm_install(source, folder, package)
            if failed:
                pytest.skip(failed)
            (folder / STAMP).touch()
    return folder
