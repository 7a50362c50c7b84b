"""Google ADK's `RemoteA2aAgent` as the client of a real `keel serve` (issue 37): ADK turns a
task's `input-required` into a function call of its own and resumes it with the app's function
response to that call, which Keel used to refuse ("send a data part keel_decisions"). ADK runs
as it is (`tests/adk_client/run.py`): it reads the card, asks, relays the pause as its call; the
reply is a function response, ADK sends it its own way, and the run goes on as decided.

ADK 2 sends a response `{"result": TEXT}` as the text itself and any other as its JSON text;
the data-part form of ADK 1.x is sent by hand in tests/test_serve_a2a_interop.py.

google-adk is installed from PyPI into its own venv, ``.venv-adk`` at the repository root
(gitignored; once, a stamp names the version; about 20 s), so its pins cannot move Keel's; if
pip cannot install it, the tests skip with pip's error."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from a2a_serving import WRITE, keel_serve, runs_in
from test_serve_a2a_fasta2a import pip_error, private_venv

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".venv-adk"
PACKAGES = ("google-adk[a2a]==2.13.0", "a2a-sdk==1.3.0")
CLIENT = Path(__file__).resolve().parent / "adk_client" / "run.py"
ADK_CALL = "mock_function_call_for_required_user_input"


@pytest.fixture(scope="session")
def adk_python() -> Path:
    return private_venv(VENV, PACKAGES)


def adk_run(python: Path, tmp: Path, response: dict[str, Any]) -> list[dict[str, Any]]:
    with keel_serve(tmp, WRITE, "--allow-writes") as (url, _):
        done = subprocess.run(
            [str(python), str(CLIENT), url, "Write it.", json.dumps(response)],
            capture_output=True, text=True, timeout=180,
        )  # fmt: skip
    assert done.returncode == 0, pip_error(done.stderr)
    return [json.loads(line) for line in done.stdout.splitlines()]


@pytest.mark.parametrize(
    ("response", "approved"),
    [({"result": "approve"}, True), ({"approved": True}, True), ({"result": "deny: no"}, False)],
)
def test_adks_remote_agent_resumes_a_paused_task_with_its_function_response(
    adk_python: Path, tmp_path: Path, response: dict[str, Any], approved: bool
) -> None:
    lines = adk_run(adk_python, tmp_path, response)
    [calls] = [line["calls"] for line in lines if line["kind"] == "calls"]
    assert calls and {c["name"] for c in calls} == {ADK_CALL}  # the pause, as ADK's own call
    posts = [line["body"] for line in lines if line["kind"] == "wire"]
    assert len(posts) == 2 and posts[1]["params"]["message"]["taskId"]  # the reply, on the task
    [run] = runs_in(tmp_path / "runs.db")
    assert run.status == "completed"
    [decision] = run.state.decisions.values()
    assert decision.approved is approved
    written = tmp_path / "repo" / "out.txt"
    assert written.exists() is approved
    answers = [p["text"] for line in lines if line["kind"] == "event" for p in line["parts"]
               if "text" in p and not p.get("thought")]  # fmt: skip
    assert answers[-1] == "Wrote out.txt."
