"""`POST /ag-ui` (keel/serve/ag_ui.py, ADR 0041), driven by the official AG-UI client.

The client is `@ag-ui/client` from npm (its `HttpAgent`, which verifies the event sequence it
receives and refuses a stream that breaks the protocol's rules), run by the small Node script
in ``tests/ag_ui_client/``. npm installs it once per machine into the test cache
(tests/side_installs.py), in a folder named after the package file. If npm cannot install it
(a registry outage), the client's tests skip with npm's own error.

Each test serves a scripted Keel agent from a process of its own (this file run as a script:
``python tests/test_serve_ag_ui.py --serve ...``), so a server can be killed with SIGKILL and
another started on the same store, as a crash and restart would.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pydantic
import pytest

from side_installs import npm_install, npm_package

ROOT = Path(__file__).resolve().parents[1]
CLIENT_SOURCE = Path(__file__).resolve().parent / "ag_ui_client"
CLIENT_PACKAGE = "@ag-ui/client@1.0.0"
SERVER_START_TIMEOUT = 30.0
CLIENT_TIMEOUT = 60.0
JSON_BODY = {"content-type": "application/json"}
"""A raw body's type: one of any other type is refused (415) before it is read (ADR 0047)."""

WRITE_SCRIPT = {
    "turns": [
        {
            "text": "I will write the note.",
            "tool_calls": [
                {"name": "write_file", "arguments": {"path": "note.txt", "content": "hello"}}
            ],
        },
        {"text": "Finished."},
    ],
    "stream_ms": 1,
}
"""A run that pauses for approval (write_file is side-effecting), streaming its text."""


# -- the server: this file, run as a script -----------------------------------------------


def serve_main(argv: list[str]) -> None:
    """Serve `--script` over `--store` on a loopback port, printed as ``port N``."""
    import uvicorn
    from starlette.applications import Starlette

    from keel.agent import Agent
    from keel.serve.ag_ui import ag_ui_routes
    from keel.tools.files import file_tools
    from keel.tools.writes import write_tools

    parser = argparse.ArgumentParser()
    for name in ("--script", "--store", "--repo"):
        parser.add_argument(name, required=True)
    parser.add_argument("--child-script")
    args = parser.parse_args(argv)
    tools = [*file_tools(args.repo), *write_tools(args.repo)]
    if args.child_script:  # the served agent delegates to a child that writes
        child = Agent(f"script:{args.child_script}", tools=write_tools(args.repo))
        tools.append(child.as_tool("writer", "Writes notes"))
    agent = Agent(f"script:{args.script}", tools=tools, store=args.store)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    config = uvicorn.Config(Starlette(routes=ag_ui_routes(agent)), log_level="warning")
    print(f"port {sock.getsockname()[1]}", flush=True)
    uvicorn.Server(config).run(sockets=[sock])


@contextmanager
def served(
    script: Path, store: Path | str, repo: Path, child_script: Path | None = None
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """The endpoint's URL, served by a process of its own, stopped after the block."""
    child = ["--child-script", str(child_script)] if child_script else []
    process = subprocess.Popen(
        [sys.executable, __file__, "--serve", "--script", str(script), "--store", str(store),
         "--repo", str(repo), *child],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line.startswith("port "):
            process.kill()
            raise AssertionError(f"the server did not start: {line!r} {process.stderr.read()}")
        url = f"http://127.0.0.1:{int(line.split()[1])}/ag-ui"
        _wait_listening(url)
        yield url, process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for pipe in (process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()


def _wait_listening(url: str) -> None:
    deadline = time.monotonic() + SERVER_START_TIMEOUT
    while True:
        try:
            httpx.get(url, timeout=2)  # 405: the route answers
            return
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


# -- the official client ---------------------------------------------------------------------


@pytest.fixture(scope="session")
def ag_ui_client(pytestconfig: pytest.Config) -> Path:
    """The client's script, beside its installed `node_modules` (installed once, ~6 s)."""
    folder = npm_package(pytestconfig, "ag-ui-client", CLIENT_SOURCE, CLIENT_PACKAGE)
    script = folder / "run.mjs"  # the script may change without the deps: copied when it did
    wanted = (CLIENT_SOURCE / "run.mjs").read_bytes()
    if not script.exists() or script.read_bytes() != wanted:
        written = folder / f"run.{os.getpid()}.tmp"
        written.write_bytes(wanted)
        written.replace(script)  # whole or not at all: another worker's node may be reading it
    return script


def run_client(client: Path, url: str, *args: str) -> list[dict[str, Any]]:
    """What the official client received, as its script prints it (JSON lines)."""
    done = subprocess.run(
        ["node", str(client), url, *args],
        capture_output=True, text=True, timeout=CLIENT_TIMEOUT, cwd=client.parent,
    )  # fmt: skip
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    errors = [line for line in lines if line["kind"] == "error"]
    assert not errors and done.returncode == 0, (errors, done.stderr[-2000:])
    return lines


def events_of(lines: list[dict[str, Any]], run: int = 0) -> list[dict[str, Any]]:
    return [line["event"] for line in lines if line["kind"] == "event" and line["run"] == run]


# -- the protocol's order rules, checked on what was received ------------------------------


def check_sequence(raw: list[dict[str, Any]], resumed_calls: frozenset[str] = frozenset()) -> None:
    """Every event one of the protocol's types; RUN_STARTED first and one terminal event last;
    each text message, tool call and step opened once and closed before the end; each tool
    result for a call that was closed (or, on a resume, the call the resume answered)."""
    from ag_ui.core import Event

    adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(Event)
    events = [adapter.validate_python(e) for e in raw]
    types = [e.type.value for e in events]
    assert types[0] == "RUN_STARTED", types
    ends = [i for i, t in enumerate(types) if t in ("RUN_FINISHED", "RUN_ERROR")]
    assert ends == [len(types) - 1], types
    text: set[str] = set()
    calls: set[str] = set()
    closed: set[str] = set(resumed_calls)
    steps: set[str] = set()
    for event, kind in zip(events[1:-1], types[1:-1], strict=True):
        if kind == "TEXT_MESSAGE_START":
            assert event.message_id not in text, f"{event.message_id} opened twice"
            text.add(event.message_id)
        elif kind in ("TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END"):
            assert event.message_id in text, f"{kind} for a message not open"
            if kind == "TEXT_MESSAGE_END":
                text.discard(event.message_id)
        elif kind == "TOOL_CALL_START":
            assert event.tool_call_id not in calls | closed, f"{event.tool_call_id} twice"
            calls.add(event.tool_call_id)
        elif kind in ("TOOL_CALL_ARGS", "TOOL_CALL_END"):
            assert event.tool_call_id in calls, f"{kind} for a call not open"
            if kind == "TOOL_CALL_END":
                calls.discard(event.tool_call_id)
                closed.add(event.tool_call_id)
        elif kind == "TOOL_CALL_RESULT":
            assert event.tool_call_id in closed, f"a result for {event.tool_call_id} not made"
        elif kind == "STEP_STARTED":
            assert event.step_name not in steps
            steps.add(event.step_name)
        elif kind == "STEP_FINISHED":
            assert event.step_name in steps
            steps.discard(event.step_name)
    assert not text and not calls and not steps, ("left open", text, calls, steps)


def sse_events(response: httpx.Response) -> list[dict[str, Any]]:
    """The `data:` objects of a server-sent event stream (the encoder's one-line events)."""
    return [
        json.loads(line[len("data: ") :])
        for line in response.text.splitlines()
        if line.startswith("data: ")
    ]


def run_input(thread: str, run: str, *messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"threadId": thread, "runId": run, "messages": list(messages), **extra}


def user(text: str, id: str = "m1") -> dict[str, Any]:
    return {"id": id, "role": "user", "content": text}


def write_script(tmp_path: Path, script: dict[str, Any]) -> Path:
    path = tmp_path / "script.json"
    path.write_text(json.dumps(script))
    return path


@contextmanager
def stored(store: Path | str) -> Iterator[Any]:
    """The store a server served (a SQLite file or a `postgresql://` URL), opened here and
    closed after."""
    from keel.store import open_store

    db = open_store(store)
    try:
        yield db
    finally:
        db.close()


# -- the tests ----------------------------------------------------------------------------------


def test_the_sequence_check_rejects_an_unclosed_message_and_a_second_terminal_event() -> None:
    """The order rules can fail: an unclosed text message, and two terminal events."""
    start = {"type": "RUN_STARTED", "threadId": "t", "runId": "r"}
    finish = {"type": "RUN_FINISHED", "threadId": "t", "runId": "r"}
    opened = {"type": "TEXT_MESSAGE_START", "messageId": "m", "role": "assistant"}
    with pytest.raises(AssertionError, match="left open"):
        check_sequence([start, opened, finish])
    with pytest.raises(AssertionError):
        check_sequence([start, finish, finish])
    check_sequence([start, opened, {"type": "TEXT_MESSAGE_END", "messageId": "m"}, finish])


def test_the_official_client_refuses_a_stream_that_breaks_the_order_rules(
    ag_ui_client: Path,
) -> None:
    """The client's verification is on: text for a message never started ends its run with
    an error, so the valid sequences the other tests see were checked by the client too."""
    from http.server import ThreadingHTTPServer

    from loopback_http import QuietHandler, serving

    broken = [
        {"type": "RUN_STARTED", "threadId": "t", "runId": "r"},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": "orphan"},
        {"type": "RUN_FINISHED", "threadId": "t", "runId": "r"},
    ]
    body = "".join(f"data: {json.dumps(e)}\n\n" for e in broken).encode()

    class Broken(QuietHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["content-length"]))
            self.reply(body, "text/event-stream")

    with serving(ThreadingHTTPServer(("127.0.0.1", 0), Broken)) as server:
        url = f"http://127.0.0.1:{server.server_address[1]}/ag-ui"
        done = subprocess.run(
            ["node", str(ag_ui_client), url, "--question", "Hi?"],
            capture_output=True, text=True, timeout=CLIENT_TIMEOUT, cwd=ag_ui_client.parent,
        )  # fmt: skip
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    (error,) = [line for line in lines if line["kind"] == "error"]
    assert "No active text message found with ID 'm'" in error["error"], error
    assert done.returncode == 1


def test_a_synthesized_run_reaches_the_official_client_as_a_valid_sequence(
    ag_ui_client: Path, tmp_path: Path
) -> None:
    """A scripted run that repeats a call: the client accepts the stream; the synthesis turn
    is a step named for its reason, announced by a `keel.synthesis` event; the answer is the
    text of that step and RUN_FINISHED's result; the calls are the ones Keel recorded."""
    from keel.records import ToolCallRequested

    script = ROOT / "examples" / "repeated_research.json"
    store = tmp_path / "runs.sqlite"
    with served(script, store, ROOT) as (url, _):
        lines = run_client(ag_ui_client, url, "--question", "Which modules does the loop use?")
    events = events_of(lines)
    check_sequence(events)
    answer = json.loads(script.read_text())["on_synthesis"]["text"]
    steps = [e["stepName"] for e in events if e["type"] == "STEP_STARTED"]
    assert steps == [*(f"step_{n}" for n in range(1, 8)), "synthesis:repeated_tool"]
    (synthesis,) = [e for e in events if e.get("name") == "keel.synthesis"]
    assert synthesis["value"]["reason"] == "repeated_tool"
    assert "repeating an identical tool call" in synthesis["value"]["why"]
    last_text = events.index(synthesis)
    text = "".join(e["delta"] for e in events[last_text:] if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert text == answer
    finished = events[-1]
    assert finished["type"] == "RUN_FINISHED" and finished["outcome"] == {"type": "success"}
    assert finished["result"]["synthesized"] == "repeated_tool"
    assert finished["result"]["answer"] == answer
    run_id = finished["result"]["run_id"]
    with stored(store) as db:
        recorded = [e.call_id for e in db.events(run_id) if isinstance(e, ToolCallRequested)]
    started = [e["toolCallId"] for e in events if e["type"] == "TOOL_CALL_START"]
    assert started == [f"{run_id}:{c}" for c in recorded] and len(recorded) == 7
    (done,) = [line for line in lines if line["kind"] == "done"]
    assert done["messages"][-1]["content"] == answer  # the client's own thread, from the snapshot


def test_a_paused_run_ends_in_an_interrupt_and_the_resume_completes_it(
    ag_ui_client: Path, tmp_path: Path
) -> None:
    """Approval needed: the first stream ends with the state and messages snapshots, then
    RUN_FINISHED with an interrupt naming the call, every argument given; the client answers
    it, the same Keel run resumes, the write happens once and the decision is recorded."""
    from keel.records import ApprovalDecided, ToolResultRecorded

    repo = tmp_path / "repo"
    repo.mkdir()
    store = tmp_path / "runs.sqlite"
    with served(write_script(tmp_path, WRITE_SCRIPT), store, repo) as (url, _):
        lines = run_client(ag_ui_client, url, "--question", "Note hello", "--then", "approve")
    first, second = events_of(lines, 0), events_of(lines, 1)
    check_sequence(first)
    assert [e["type"] for e in first[-3:]] == [
        "STATE_SNAPSHOT",
        "MESSAGES_SNAPSHOT",
        "RUN_FINISHED",
    ]
    outcome = first[-1]["outcome"]
    run_id = first[1]["value"]["run_id"]
    (interrupt,) = outcome["interrupts"]
    assert outcome["type"] == "interrupt"
    assert interrupt["id"] == interrupt["toolCallId"] == f"{run_id}:k1_0"
    assert interrupt["metadata"]["keel"]["arguments"] == {"path": "note.txt", "content": "hello"}
    deltas = [e["delta"] for e in first if e["type"] == "TEXT_MESSAGE_CONTENT"]
    assert len(deltas) > 1 and "".join(deltas) == "I will write the note."  # streamed (ADR 0039)
    pending = first[-3]["snapshot"]["keel"]["pending_approvals"]
    assert [p["interrupt_id"] for p in pending] == [interrupt["id"]]
    check_sequence(second, resumed_calls=frozenset({interrupt["id"]}))
    assert second[1]["value"] == {"run_id": run_id, "resumed": True}
    assert [e["toolCallId"] for e in second if e["type"] == "TOOL_CALL_RESULT"] == [interrupt["id"]]
    assert second[-1]["outcome"] == {"type": "success"}
    assert second[-1]["result"]["answer"] == "Finished."
    assert (repo / "note.txt").read_text() == "hello"
    with stored(store) as db:
        events = db.events(run_id)
        status = db.get_run(run_id).status
    decided = [e for e in events if isinstance(e, ApprovalDecided)]
    assert [(d.call_id, d.approved, d.by) for d in decided] == [("k1_0", True, "ag-ui")]
    assert len([e for e in events if isinstance(e, ToolResultRecorded)]) == 1
    assert status == "completed"


def test_a_resume_after_the_server_was_killed_continues_the_run_from_the_store(
    ag_ui_client: Path, tmp_path: Path, store_target: str | Path
) -> None:
    """The thread is saved by the client, the server killed with SIGKILL while the run
    waits; another server on the same store (a SQLite file, or Postgres) takes the client's
    denial and finishes the run. Nothing but the store connects the two."""
    from keel.records import ApprovalDecided

    repo = tmp_path / "repo"
    repo.mkdir()
    store, thread = store_target, tmp_path / "thread.json"
    script = write_script(tmp_path, WRITE_SCRIPT)
    with served(script, store, repo) as (url, process):
        first = run_client(ag_ui_client, url, "--question", "Note hello", "--save", str(thread))
        process.send_signal(signal.SIGKILL)
        process.wait()
    assert events_of(first)[-1]["outcome"]["type"] == "interrupt"
    with served(script, store, repo) as (url, _):
        lines = run_client(ag_ui_client, url, "--resume", str(thread), "--decision", "deny")
    events = events_of(lines)
    run_id = events[1]["value"]["run_id"]
    check_sequence(events, resumed_calls=frozenset({f"{run_id}:k1_0"}))
    assert events[-1]["outcome"] == {"type": "success"}
    (result,) = [e for e in events if e["type"] == "TOOL_CALL_RESULT"]
    assert result["content"].startswith("Denied by ag-ui: not in this repository.")
    assert not (repo / "note.txt").exists()
    with stored(store) as db:
        (decided,) = [e for e in db.events(run_id) if isinstance(e, ApprovalDecided)]
    assert (decided.approved, decided.reason) == (False, "not in this repository")


def test_a_childs_call_is_approved_from_the_ag_ui_client_and_the_tree_completes(
    ag_ui_client: Path, tmp_path: Path, store_target: str | Path
) -> None:
    """A call of a sub-agent's run waits for approval: its interrupt names the parent run, then
    the child's call (``PARENT:CHILD:k1_0``); the client's resume of it reaches the parent run
    (not a run named ``PARENT:CHILD``), the child writes once and both runs complete."""
    from keel.records import ApprovalDecided

    repo = tmp_path / "repo"
    repo.mkdir()
    parent_script = {
        "turns": [
            {"text": "", "tool_calls": [{"name": "writer", "arguments": {"task": "note it"}}]},
            {"text": "Parent finished."},
        ]
    }
    child_script = tmp_path / "child.json"
    child_script.write_text(json.dumps(WRITE_SCRIPT))
    script = write_script(tmp_path, parent_script)
    with served(script, store_target, repo, child_script) as (url, _):
        lines = run_client(ag_ui_client, url, "--question", "Note hello", "--then", "approve")
    first, second = events_of(lines, 0), events_of(lines, 1)
    run_id = first[1]["value"]["run_id"]
    (interrupt,) = first[-1]["outcome"]["interrupts"]
    parent, child, call = interrupt["id"].split(":")
    assert (parent, call) == (run_id, "k1_0") and child.startswith("run_") and child != run_id
    delegation = f"{run_id}:k1_0"  # the parent's own call, answered once its child has ended
    check_sequence(second, resumed_calls=frozenset({interrupt["id"], delegation}))
    assert second[1]["value"] == {"run_id": run_id, "resumed": True}
    assert second[-1]["outcome"] == {"type": "success"}
    assert second[-1]["result"]["answer"] == "Parent finished."
    assert (repo / "note.txt").read_text() == "hello"
    with stored(store_target) as db:
        decided = [e for e in db.events(child) if isinstance(e, ApprovalDecided)]
        statuses = (db.get_run(run_id).status, db.get_run(child).status)
    assert [(d.call_id, d.approved, d.by) for d in decided] == [("k1_0", True, "ag-ui")]
    assert statuses == ("completed", "completed")


def test_a_request_that_is_not_a_valid_run_or_resume_is_refused_and_records_nothing(
    tmp_path: Path,
) -> None:
    """Bodies that are not a RunAgentInput, a run without a question, and resumes that do not
    answer a pending interrupt properly: each a 4xx with a message; no run is started and
    the paused run's pending call stays undecided."""
    from keel.serve.ag_ui import MAX_BODY_BYTES

    repo = tmp_path / "repo"
    repo.mkdir()
    store = tmp_path / "runs.sqlite"
    with served(write_script(tmp_path, WRITE_SCRIPT), store, repo) as (url, _):
        paused = sse_events(httpx.post(url, json=run_input("t", "r0", user("Note")), timeout=30))
        run_id = paused[1]["value"]["run_id"]
        call = f"{run_id}:k1_0"

        def resume(*entries: dict[str, Any]) -> dict[str, Any]:
            return run_input("t", "r1", user("Note"), resume=list(entries))

        refused = [
            (b"not json", 422, "not an AG-UI RunAgentInput"),
            (json.dumps({"runId": "r", "messages": []}).encode(), 422, "threadId"),
            (run_input("t", "r", {"id": "a", "role": "assistant", "content": "hi"}), 422,
             "needs a user message last"),
            (run_input("t", "r", user("   ")), 422, "no text"),
            (resume({"interruptId": "nope", "status": "resolved"}), 422, "not one Keel sent"),
            (resume({"interruptId": "run_none:k1_0", "status": "resolved",
                     "payload": {"approved": True}}), 404, "no run run_none"),
            (resume({"interruptId": f"{run_id}:k9_9", "status": "resolved",
                     "payload": {"approved": True}}), 422, "not a call of run"),
            (resume({"interruptId": call, "status": "resolved", "payload": {"approve": True}}),
             422, "must be {\"approved\""),
            (resume({"interruptId": call, "status": "resolved", "payload": {"approved": True}},
                    {"interruptId": call, "status": "resolved", "payload": {"approved": True}}),
             422, "one interrupt twice"),
        ]  # fmt: skip
        refused.append((b"x" * (MAX_BODY_BYTES + 1), 413, "larger than"))
        lone = b'{"threadId": "t", "runId": "r", "messages": [{"id": "m", "role": "user", '
        refused.append((lone + b'"content": "\\ud800"}]}', 422, "hex escape"))  # a lone surrogate
        on_paused = run_input("t", "r2", *paused[-2]["messages"], user("And?", id="m2"))
        refused.append((on_paused, 409, "has not ended (awaiting_approval): resume it first"))
        for body, status, said in refused:
            sent = (
                httpx.post(url, content=body, headers=JSON_BODY, timeout=10)
                if isinstance(body, bytes)
                else httpx.post(url, json=body, timeout=10)
            )
            assert sent.status_code == status, (body, sent.text)
            assert said in sent.json()["error"], (said, sent.json())
    with stored(store) as db:
        runs = db.list_runs(10)
        record = db.get_run(run_id)
    assert [r.run_id for r in runs] == [run_id]
    assert record.status == "awaiting_approval" and record.state.decisions == {}


def test_a_dismissed_interrupt_denies_the_call_and_the_run_goes_on(tmp_path: Path) -> None:
    """A resume entry with status `cancelled` abandons the approval: Keel records a denial
    with a reason saying so, the model is told, and the run completes without the write."""
    from keel.records import ApprovalDecided
    from keel.serve.ag_ui import CANCELLED_REASON

    repo = tmp_path / "repo"
    repo.mkdir()
    store = tmp_path / "runs.sqlite"
    with served(write_script(tmp_path, WRITE_SCRIPT), store, repo) as (url, _):
        paused = sse_events(httpx.post(url, json=run_input("t", "r0", user("Note")), timeout=30))
        run_id = paused[1]["value"]["run_id"]
        entry = {"interruptId": f"{run_id}:k1_0", "status": "cancelled"}
        body = run_input("t", "r1", user("Note"), resume=[entry])
        resumed = sse_events(httpx.post(url, json=body, timeout=30))
    check_sequence(resumed, resumed_calls=frozenset({entry["interruptId"]}))
    assert resumed[-1]["outcome"] == {"type": "success"}
    assert not (repo / "note.txt").exists()
    with stored(store) as db:
        (decided,) = [e for e in db.events(run_id) if isinstance(e, ApprovalDecided)]
    assert (decided.approved, decided.reason, decided.by) == (False, CANCELLED_REASON, "ag-ui")


def test_a_denials_reason_is_cleaned_and_capped_before_the_model_hears_it(
    tmp_path: Path,
) -> None:
    """The reason comes from the front end and is told to the model: terminal escapes and
    control characters are removed and it is cut at `MAX_REASON`, as the web view does."""
    from keel.records import ApprovalDecided, ToolResultRecorded
    from keel.serve.ag_ui import MAX_REASON

    repo = tmp_path / "repo"
    repo.mkdir()
    store = tmp_path / "runs.sqlite"
    with served(write_script(tmp_path, WRITE_SCRIPT), store, repo) as (url, _):
        paused = sse_events(httpx.post(url, json=run_input("t", "r0", user("Note")), timeout=30))
        run_id = paused[1]["value"]["run_id"]
        reason = "\x1b[2J\x1b]0;owned\x07no\x00" + "x" * 3 * MAX_REASON
        payload = {"approved": False, "reason": reason}
        entry = {"interruptId": f"{run_id}:k1_0", "status": "resolved", "payload": payload}
        resumed = sse_events(httpx.post(url, json=run_input("t", "r", resume=[entry]), timeout=30))
    assert resumed[-1]["outcome"] == {"type": "success"}
    with stored(store) as db:
        events = db.events(run_id)
    (decided,) = [e for e in events if isinstance(e, ApprovalDecided)]
    assert decided.reason is not None and len(decided.reason) == MAX_REASON
    assert decided.reason.startswith("no") and decided.reason.isprintable()
    (told,) = [e for e in events if isinstance(e, ToolResultRecorded)]
    assert "\x1b" not in told.content and "owned" not in told.content


def test_a_resume_sent_again_records_nothing_twice_and_a_contrary_one_is_refused(
    tmp_path: Path,
) -> None:
    """The call was approved already (by `keel approve`'s path, or a resume whose stream was
    lost): a resume denying it is refused (409, decisions are final); one approving it records
    nothing again and resumes; once the run has ended, a resume is refused."""
    from keel import approvals
    from keel.records import ApprovalDecided

    repo = tmp_path / "repo"
    repo.mkdir()
    store = tmp_path / "runs.sqlite"
    with served(write_script(tmp_path, WRITE_SCRIPT), store, repo) as (url, _):
        paused = sse_events(httpx.post(url, json=run_input("t", "r0", user("Note")), timeout=30))
        run_id = paused[1]["value"]["run_id"]
        with stored(store) as db:
            approvals.approve(db, run_id, "k1_0", by="alice")
        call = f"{run_id}:k1_0"

        def resume(approved: bool) -> httpx.Response:
            entry = {"interruptId": call, "status": "resolved", "payload": {"approved": approved}}
            return httpx.post(url, json=run_input("t", "r", resume=[entry]), timeout=30)

        contrary = resume(False)
        assert contrary.status_code == 409
        assert "approved already by alice" in contrary.json()["error"]
        again = sse_events(resume(True))
        ended = resume(True)
    assert again[-1]["outcome"] == {"type": "success"}
    assert (repo / "note.txt").read_text() == "hello"
    assert ended.status_code == 409 and "has ended (completed)" in ended.json()["error"]
    with stored(store) as db:
        decided = [e for e in db.events(run_id) if isinstance(e, ApprovalDecided)]
    assert [(d.approved, d.by) for d in decided] == [(True, "alice")]


def test_a_client_that_goes_away_leaves_the_run_going_to_its_end(tmp_path: Path) -> None:
    """The stream is closed after its first event: the run is still running then, and it
    completes, recorded, without anyone listening."""
    slow = {
        "turns": [
            {"tool_calls": [{"name": "list_files", "arguments": {"path": "."}}]},
            {"text": "Done."},
        ],
        "latency_ms": 400,
    }
    store = tmp_path / "runs.sqlite"
    with served(write_script(tmp_path, slow), store, tmp_path) as (url, _):
        body = run_input("t", "r", user("List?"))
        with httpx.stream("POST", url, json=body, timeout=30) as response:
            lines = response.iter_lines()
            next(line for line in lines if line.startswith("data: "))  # RUN_STARTED
            keel_run = json.loads(next(line for line in lines if line.startswith("data: "))[6:])
        run_id = keel_run["value"]["run_id"]
        statuses = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with stored(store) as db:
                record = db.get_run(run_id)
            statuses.append(record.status if record else None)
            if statuses[-1] == "completed":
                break
            time.sleep(0.1)
    assert statuses[0] in ("running", None) and statuses[-1] == "completed", statuses
    assert record.state.answer == "Done."


def test_a_resume_of_a_run_another_process_holds_ends_with_run_error_lease_held(
    tmp_path: Path,
) -> None:
    """Another live process holds the paused run's lease (a `keel resume` elsewhere): the
    decision is recorded, and the stream ends with RUN_ERROR `LeaseHeld`, the run not run
    twice; the resume can be sent again once that process is done."""
    import asyncio

    repo = tmp_path / "repo"
    repo.mkdir()
    store = tmp_path / "runs.sqlite"
    with served(write_script(tmp_path, WRITE_SCRIPT), store, repo) as (url, _):
        paused = sse_events(httpx.post(url, json=run_input("t", "r0", user("Note")), timeout=30))
        run_id = paused[1]["value"]["run_id"]
        # a holder on another machine: only its lease's expiry could free the run
        with stored(store) as db:
            asyncio.run(db.acquire_lease(run_id, "elsewhere:1:other", 60))
        entry = {
            "interruptId": f"{run_id}:k1_0",
            "status": "resolved",
            "payload": {"approved": True},
        }
        events = sse_events(httpx.post(url, json=run_input("t", "r1", resume=[entry]), timeout=30))
    check_sequence(events, resumed_calls=frozenset({entry["interruptId"]}))
    assert events[-1]["type"] == "RUN_ERROR" and events[-1]["code"] == "LeaseHeld"
    assert "elsewhere:1:other" in events[-1]["message"]
    assert [e["name"] for e in events if e["type"] == "CUSTOM"] == [
        "keel.run",
        "keel.approval_decided",
    ]
    assert not (repo / "note.txt").exists()


def test_a_failed_run_ends_with_run_error_carrying_the_failure_kind(tmp_path: Path) -> None:
    """A provider that refuses: the stream ends with RUN_ERROR, its code the classified kind
    (`ModelError`), after the snapshots; nothing after it."""
    refusing = {"turns": [{"error": {"status": 400, "message": "the request is malformed"}}]}
    with served(write_script(tmp_path, refusing), tmp_path / "runs.sqlite", tmp_path) as (url, _):
        events = sse_events(httpx.post(url, json=run_input("t", "r", user("Why?")), timeout=30))
    check_sequence(events)
    assert events[-1]["type"] == "RUN_ERROR" and events[-1]["code"] == "ModelError"
    assert "the request is malformed" in events[-1]["message"]
    assert events[-2]["type"] == "MESSAGES_SNAPSHOT"


def test_a_new_question_on_the_thread_is_a_follow_up_in_the_keel_conversation(
    tmp_path: Path,
) -> None:
    """The thread's messages hold the answer of an earlier Keel run (its message id names
    the run): the next question continues that run's conversation (ADR 0038)."""
    answering = {"turns": [{"text": "An answer."}]}
    store = tmp_path / "runs.sqlite"
    with served(write_script(tmp_path, answering), store, tmp_path) as (url, _):
        first = sse_events(httpx.post(url, json=run_input("t", "r1", user("One?")), timeout=30))
        thread = first[-2]["messages"]  # the snapshot: the question and the answer, by id
        body = run_input("t", "r2", *thread, user("And two?", id="m2"))
        second = sse_events(httpx.post(url, json=body, timeout=30))
    check_sequence(second)
    first_run, second_run = first[1]["value"]["run_id"], second[1]["value"]["run_id"]
    assert first_run != second_run
    with stored(store) as db:
        config = db.get_run(second_run).config
    assert (config.conversation_id, config.continues_from) == (first_run, first_run)


def test_a_discarded_attempts_text_is_closed_marked_and_left_out_of_the_snapshot() -> None:
    """A streamed attempt that failed: its message is ended and marked `keel.text_discarded`;
    the retry streams its own message; the snapshot holds the recorded answer only."""
    from ag_ui.core import RunFinishedEvent, RunStartedEvent

    from keel.records import ModelRequestSent, ModelResponseReceived
    from keel.serve.ag_ui_events import EventMapper, messages_snapshot
    from keel.transports.streaming import TextDelta, TextDiscarded

    def request(attempt: int) -> ModelRequestSent:
        return ModelRequestSent(
            step=1, attempt=attempt, tool_choice=None, synthesis=None, items=1,
            estimated_input_tokens=10,
        )  # fmt: skip

    response = ModelResponseReceived(step=1, text="Hello there.")
    stream = [
        request(1), TextDelta("Hel", 1, 1), TextDiscarded(1, 1),
        request(2), TextDelta("Hello", 1, 2), TextDelta(" there.", 1, 2), response,
    ]  # fmt: skip
    mapper = EventMapper("run_x")
    mapped = [out for item in stream for out in mapper.feed(item)] + mapper.close()
    events = [
        RunStartedEvent(thread_id="t", run_id="r"),
        *mapped,
        RunFinishedEvent(thread_id="t", run_id="r"),
    ]
    raw = [e.model_dump(mode="json", by_alias=True) for e in events]
    check_sequence(raw)
    (marker,) = [e for e in raw if e.get("name") == "keel.text_discarded"]
    assert marker["value"]["message_id"] == "run_x:s1a1"
    retried = [e["delta"] for e in raw if e.get("messageId") == "run_x:s1a2" and "delta" in e]
    assert "".join(retried) == "Hello there."
    snapshot = messages_snapshot("run_x", "Hi?", [request(1), request(2), response], [])
    assert [(m.id, m.content) for m in snapshot] == [
        ("run_x:question", "Hi?"),
        ("run_x:s1a2", "Hello there."),
    ]


@pytest.mark.parametrize("reason", ["repeated_tool", "budget", "deadline"])
def test_every_synthesis_reason_names_its_step_and_says_why(reason: str) -> None:
    """A synthesis-only turn, whatever its reason, is a step named for it and a
    `keel.synthesis` custom event with the reason and why the run answers now."""
    from keel.messages import SynthesisReason
    from keel.records import ModelRequestSent
    from keel.serve.ag_ui_events import SYNTHESIS_WHY, EventMapper

    turn = ModelRequestSent(
        step=4, attempt=1, tool_choice="none", synthesis=SynthesisReason(reason), items=3,
        estimated_input_tokens=10,
    )  # fmt: skip
    started, said = EventMapper("run_x").feed(turn)
    assert started.model_dump(by_alias=True)["stepName"] == f"synthesis:{reason}"
    assert said.model_dump()["name"] == "keel.synthesis"
    assert said.model_dump()["value"] == {
        "reason": reason,
        "step": 4,
        "why": SYNTHESIS_WHY[SynthesisReason(reason)],
    }


def test_a_registry_outage_skips_with_npms_error(tmp_path: Path) -> None:
    """No registry to reach (a closed loopback port, an empty cache): the reason to skip is
    npm's own error, so CI says why the client's tests did not run instead of failing."""
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}/"
    env = os.environ | {
        "npm_config_registry": closed, "npm_config_cache": str(tmp_path / "cache"),
        "npm_config_fetch_retries": "0", "npm_config_fetch_timeout": "2000",
        "npm_config_userconfig": os.devnull,
    }  # fmt: skip
    reason = npm_install(CLIENT_SOURCE, tmp_path / "client", CLIENT_PACKAGE, env)
    assert reason is not None
    assert reason.startswith(f"npm could not install {CLIENT_PACKAGE}: "), reason
    assert "ECONNREFUSED" in reason, reason


if __name__ == "__main__" and sys.argv[1:2] == ["--serve"]:
    serve_main(sys.argv[2:])
