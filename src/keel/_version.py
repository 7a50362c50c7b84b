"""Keel's version, from the installed distribution's metadata (`keel-runtime`, ADR 0036),
read on first use: `importlib.metadata` costs ~30 ms, and `import keel` stays cheap (ADR 0042)."""

from __future__ import annotations

DISTRIBUTION = "keel-runtime"
"""The name Keel is installed under (`keel` on PyPI is someone else's)."""

UNKNOWN_VERSION = "0+unknown"
"""The version of a source tree that was never installed: a valid PEP 440 version that sorts
before every release and says it is not one."""


def installed_version() -> str:
    """The installed distribution's version, or `UNKNOWN_VERSION` when it has no metadata."""
    import importlib.metadata

    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return UNKNOWN_VERSION
