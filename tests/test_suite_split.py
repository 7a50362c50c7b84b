"""`make test` runs the suite in two parts (ADR 0055): the tests that are not `solo` on every
core, then the `solo` ones one at a time. What is solo is decided in tests/conftest.py from a
test's fixtures and file; a test of the embedded model that ran beside another took twice as
long and the ones timed by the model's silence timed out."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def collected(*args: str) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-o", "addopts=", "-q", "-p",
         "no:cacheprovider", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode in (0, 5), done.stdout + done.stderr  # 5: nothing collected
    return {line for line in done.stdout.splitlines() if "::" in line}


def test_the_embedded_models_tests_run_solo_and_the_rest_on_every_core() -> None:
    files = ["tests/test_local_timeout.py", "tests/test_local_15b.py", "tests/test_canonical.py"]
    solo = collected("-m", "solo", *files)
    rest = collected("-m", "not solo", *files)
    everything = collected(*files)
    assert solo | rest == everything and not solo & rest
    assert {t.split("::")[0] for t in solo} == {files[0], files[1]}  # the model's fixtures
    assert {t.split("::")[0] for t in rest} == {files[2]}  # a test of pure code shares
    assert len(collected("-m", "solo", "tests/test_serve_hostile.py")) >= 1  # timed by the machine
