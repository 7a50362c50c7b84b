"""The release check (issue 26, ADR 0036): the sdist and the wheel build, and the wheel,
installed into a fresh virtual environment, gives a working `keel` command.

What it proves: the distribution is named `keel-runtime` (not PyPI's unrelated `keel`), the
wheel holds the whole package with its data files (scenarios, templates, `py.typed`), declares
the extras the install lines of docs/install.md name, and its console script starts from outside
the clone. What it does not: that the dependencies resolve from the registry. To stay offline and
fast, the wheel is installed with `--no-deps`, and the new environment reaches the
dependencies already installed beside this interpreter through a `.pth` line (a path only, so
that environment's own `keel` is never imported: the check asserts where `keel` came from).
"""

from __future__ import annotations

import email
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IGNORED = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", "*.sqlite*"
)


def run(*argv: str | Path, cwd: Path, timeout: float = 120) -> str:
    done = subprocess.run(
        [str(a) for a in argv], cwd=cwd, capture_output=True, text=True, timeout=timeout,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )  # fmt: skip
    assert done.returncode == 0, f"{argv}: {done.stdout}\n{done.stderr}"
    return done.stdout


def test_the_sdist_and_wheel_build_and_the_wheel_runs_keel_from_a_fresh_venv(
    tmp_path: Path,
) -> None:
    source = tmp_path / "source"  # a copy: building writes egg-info into the tree it builds
    shutil.copytree(ROOT, source, ignore=IGNORED, symlinks=True)
    dist = tmp_path / "dist"
    run(sys.executable, "-m", "build", "--no-isolation", "--outdir", dist, source, cwd=tmp_path)
    sdists = list(dist.glob("keel_runtime-*.tar.gz"))
    wheels = list(dist.glob("keel_runtime-*-py3-none-any.whl"))
    assert len(sdists) == 1 and len(wheels) == 1, sorted(p.name for p in dist.iterdir())

    with zipfile.ZipFile(wheels[0]) as wheel:
        names = set(wheel.namelist())
        info = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = email.message_from_bytes(wheel.read(info))
    assert metadata["Name"] == "keel-runtime"
    assert {"local", "mcp", "otel", "ui", "postgres", "browser"} <= set(
        metadata.get_all("Provides-Extra") or []
    )
    for packaged in ("keel/py.typed", "keel/evals/scenarios/loop.toml", "keel/cli/app.py"):
        assert packaged in names, packaged
    assert any(n.startswith("keel/ui/templates/") for n in names)

    fresh = tmp_path / "venv"
    venv.create(fresh, with_pip=False)
    python = fresh / "bin" / "python"
    purelib = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))",
                       cwd=tmp_path).strip())  # fmt: skip
    (purelib / "shared-dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    run(sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index",
        "--quiet", wheels[0], cwd=tmp_path)  # fmt: skip
    where = run(python, "-c", "import keel; print(keel.__file__)", cwd=tmp_path).strip()
    assert Path(where).is_relative_to(purelib), where  # the wheel's copy, not the clone's
    helped = run(fresh / "bin" / "keel", "--help", cwd=tmp_path)
    assert "Usage: keel" in helped and "resume" in helped
    models = run(fresh / "bin" / "keel", "models", cwd=tmp_path)
    assert "local model file:" in models
