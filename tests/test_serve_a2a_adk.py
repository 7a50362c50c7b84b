"""Google ADK's `RemoteA2aAgent` as the client of a real `keel serve` (issue 37): ADK turns a
task's `input-required` into a function call of its own and resumes it with the app's function
response to that call, which Keel used to refuse ("send a data part keel_decisions"). ADK runs
as it is (`tests/adk_client/run.py`): it reads the card, asks, relays the pause as its call; the
reply is a function response, ADK sends it its own way, and the run goes on as decided. One
ADK process asks three times (its import alone takes seconds).

ADK 2 sends a response `{"result": TEXT}` as the text itself and any other as its JSON text;
the data-part form of ADK 1.x is sent by hand in tests/test_serve_a2a_interop.py.

google-adk is installed from PyPI into its own venv, once per machine in the test cache
(tests/side_installs.py; about 20 s with pip's cache warm), so its pins cannot move Keel's; if
pip cannot install it, the tests skip with pip's error."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from a2a_serving import WRITE, keel_serve, runs_in
from side_installs import pip_error, private_venv

PACKAGES = ("google-adk[a2a]==2.13.0", "a2a-sdk==1.3.0")
CLIENT = Path(__file__).resolve().parent / "adk_client" / "run.py"
ADK_CALL = "mock_function_call_for_required_user_input"


@pytest.fixture(scope="session")
def adk_python(pytestconfig: pytest.Config) -> Path:
    return private_venv(pytestconfig, "adk", PACKAGES)


CASES = [({"result": "approve"}, True), ({"approved": True}, True), ({"result": "deny: no"}, False)]
"""Each function response, and whether it approves: ADK 2 sends the first and last as their
text, the second as its JSON text (refused before: seen failing)."""


def test_adks_remote_agent_resumes_a_paused_task_with_its_function_response(
    adk_python: Path, tmp_path: Path
) -> None:
    with keel_serve(tmp_path, WRITE, "--allow-writes") as (url, _):
        done = subprocess.run(
            [str(adk_python), str(CLIENT), url, "Write it.",
             *(json.dumps(response) for response, _ in CASES)],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    assert done.returncode == 0, pip_error(done.stderr)
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    runs = sorted(runs_in(tmp_path / "runs.db"), key=lambda r: r.created_at)
    assert len(runs) == len(CASES)
    for number, ((response, approved), run) in enumerate(zip(CASES, runs, strict=True)):
        said = [line for line in lines if line["case"] == number]
        [calls] = [line["calls"] for line in said if line["kind"] == "calls"]
        assert calls and {c["name"] for c in calls} == {ADK_CALL}  # the pause, as ADK's call
        posts = [line["body"]["params"]["message"] for line in said if line["kind"] == "wire"]
        assert len(posts) == 2 and posts[1]["taskId"] == run.run_id  # the reply, on the task
        assert run.status == "completed", (response, run.status)
        [decision] = run.state.decisions.values()
        assert decision.approved is approved, response
        answers = [p["text"] for line in said if line["kind"] == "event" for p in line["parts"]
                   if "text" in p and not p.get("thought")]  # fmt: skip
        assert answers[-1] == "Wrote out.txt."
    written = (tmp_path / "repo" / "out.txt").read_text()
    assert written == "hello\n" * sum(approved for _, approved in CASES)  # appended per approval
