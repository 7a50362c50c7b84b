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
    """fasta2a's own client, its own parsing: the send's result is read as a task (it came
    back `{}` before ADR 0065), `tasks/get` with `"id": null` is answered (-32600 before),
    the approval by text runs the write once, and a streamed question's events are read."""
    with keel_serve(tmp_path, WRITE, "--allow-writes") as (url, _):
        done = subprocess.run(
            [str(fasta2a_python), str(CLIENT), url, "Write it.", "approve"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    lines: list[dict[str, Any]] = [json.loads(line) for line in done.stdout.splitlines()]
    kinds = [line["kind"] for line in lines]
    assert kinds == ["card", "sent", "task", "sent", "task", "streamed"], lines
    card, first, paused, second, final, streamed = (line[line["kind"]] for line in lines)
    assert card["skills"][0]["input_modes"]
    assert first["result"]["task"]["id"] == paused["id"], first
    assert paused["status"]["state"] == "input-required"
    assert second["result"]["task"]["id"] == paused["id"], second
    assert final["status"]["state"] == "completed"
    assert final["artifacts"][0]["parts"][0]["text"] == "Wrote out.txt."
    assert (tmp_path / "repo" / "out.txt").read_text() == "hello\n"  # written once
    results = [event["result"] for event in streamed]
    assert results and all(results), streamed  # none read as {}
    assert "task" in results[0]
    last = results[-1].get("status_update") or results[-1]["task"]  # as fasta2a names them
    assert last["status"]["state"] == "input-required"


@pytest.mark.parametrize(
    ("kind", "key"),
    [("task", "task"), ("message", "message"), ("status-update", "statusUpdate"),
     ("artifact-update", "artifactUpdate")],
)  # fmt: skip
def test_a_03_result_is_wrapped_under_the_key_fasta2a_reads(kind: str, key: str) -> None:
    from keel.serve.fasta2a_dialect import NULL_ID, wrapped

    result = {"kind": kind, "taskId": "t"}
    answer = wrapped({"jsonrpc": "2.0", "id": NULL_ID, "result": dict(result)}, True, True)
    assert answer == {"jsonrpc": "2.0", "id": None, "result": {key: result}}
    plain = wrapped({"jsonrpc": "2.0", "id": "7", "result": dict(result)}, False, False)
    assert plain == {"jsonrpc": "2.0", "id": "7", "result": result}  # other clients: as 0.3


async def test_the_dialect_reads_no_more_than_the_body_bound_itself() -> None:
    """The dialect reads a JSON-RPC body before the SDK does: it holds no more of it than the
    guard's bound, and answers 413 past it, whatever middleware stands in front of it."""
    from keel.serve.doors import MAX_BODY_BYTES
    from keel.serve.fasta2a_dialect import Fasta2aDialect

    chunk = b"x" * (1024 * 1024)
    chunks_sent = 0

    async def receive() -> dict[str, Any]:
        nonlocal chunks_sent
        chunks_sent += 1
        return {"type": "http.request", "body": chunk, "more_body": chunks_sent < 64}

    reached: list[bool] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        reached.append(True)

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/a2a", "headers": []}
    dialect = Fasta2aDialect(app, paths=frozenset({"/a2a"}), fasta2a_path="/a2a/")
    await dialect(scope, receive, send)
    assert not reached
    assert sent[0]["status"] == 413
    assert chunks_sent * len(chunk) > MAX_BODY_BYTES  # taken and dropped, never held
    body = json.loads(b"".join(m.get("body", b"") for m in sent[1:]))
    assert body["error"]["code"] == -32600
