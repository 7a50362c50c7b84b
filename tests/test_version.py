"""`keel.__version__`: the installed distribution's version (keel-runtime), read from its
metadata on first use so `import keel` stays cheap, with a stated fallback when Keel runs from
a source tree that was never installed (ADR 0065)."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest

import keel


def test_the_version_is_the_installed_distributions() -> None:
    assert keel.__version__ == importlib.metadata.version("keel-runtime")
    assert keel.__version__[0].isdigit()


def test_a_source_tree_never_installed_has_the_fallback_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from keel import _version

    def not_installed(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    assert _version.installed_version() == _version.UNKNOWN_VERSION == "0+unknown"


def test_importing_keel_does_not_read_the_metadata() -> None:
    """The version is read when asked for, not at `import keel` (ADR 0042)."""
    code = "import sys, keel; print('importlib.metadata' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_the_version_is_not_part_of_the_public_names() -> None:
    assert "__version__" not in keel.__all__ and "__version__" in dir(keel)
