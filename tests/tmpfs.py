"""A small tmpfs mounted for one test, to fill a real file system; the test is skipped where
mounting is not allowed (not root, no CAP_SYS_ADMIN)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

__all__ = ["small_tmpfs"]


@contextmanager
def small_tmpfs(folder: Path, size: str) -> Iterator[Path]:
    """`folder/small`, a tmpfs of `size` (as mount takes it: "512k", "1m"), unmounted after."""
    mount = folder / "small"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
