"""fasta2a (pydantic's A2A library) as the client of a real `keel serve` (issue 37): it used
to refuse Keel's card (skills without `inputModes`/`outputModes`) and get "method not found"
for its `message/send`. Its card check, its request serializer and its URL are used as they
are (`tests/fasta2a_client/run.py`): the card validates, a question runs, a paused task is
approved by the text "approve" on its task id, and the write happens once.

fasta2a is installed from PyPI into its own venv, once per machine in the test cache
(tests/side_installs.py), so its pins cannot move Keel's; if pip cannot install it, the test
skips with pip's error."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from a2a_serving import WRITE, keel_serve
from side_installs import private_venv

PACKAGES = ("fasta2a==2.1.1", "httpx>=0.27")
CLIENT = Path(__file__).resolve().parent / "fasta2a_client" / "run.py"


@pytest.fixture(scope="session")
def fasta2a_python(pytestconfig: pytest.Config) -> Path:
    return private_venv(pytestconfig, "fasta2a", PACKAGES)


def test_fasta2a_reads_the_card_asks_and_approves_a_paused_task_by_text(
    fasta2a_python: Path, tmp_path: Path
) -> None:
    with keel_serve(tmp_path, WRITE, "--allow-writes") as (url, _):
        done = subprocess.run(
            [str(fasta2a_python), str(CLIENT), url, "Write it.", "approve"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    lines: list[dict[str, Any]] = [json.loads(line) for line in done.stdout.splitlines()]
    card, first, paused, second, final = lines
    assert card["kind"] == "card" and card["skills"][0]["input_modes"]
    assert "error" not in first["answer"] and "error" not in second["answer"], lines
    assert paused["task"]["status"]["state"] == "input-required"
    assert final["task"]["status"]["state"] == "completed"
    assert final["task"]["artifacts"][0]["parts"][0]["text"] == "Wrote out.txt."
    assert (tmp_path / "repo" / "out.txt").read_text() == "hello\n"  # written once
