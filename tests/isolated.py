"""Running a snippet in a fresh interpreter, for faults that would hang or pin the test process."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


def run_python(code: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run `code` in a new interpreter; one that does not exit in time fails the test."""
    try:
        return subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the process did not exit within {timeout}s; output so far: {exc.stdout!r}")
