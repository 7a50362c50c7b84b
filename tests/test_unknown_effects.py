"""A side effect whose effect is unknown is not run again by asking twice (ADR 0033).

A side-effecting call that timed out with its thread still running (or crashed, or was
cancelled while it ran) may have happened. An identical call later in the same run waits for a
person's decision, even when the tool is pre-approved, and the approver is told why.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import keel
from keel.records import ApprovalRequested, ToolResultRecorded
from keel.tools.base import Effect, Tool, make_tool
from keel.transports.scripted import ScriptedTransport
from support import call


def slow_append(path: Path, finished: threading.Event) -> Tool:
    def append_line(text: str) -> str:
        """Append a line to the notes file."""
        time.sleep(0.4)  # longer than its timeout: it goes on in its thread after the timeout
        with path.open("a") as file:
            file.write(text + "\n")
        finished.set()
        return "appended"

    return make_tool(append_line, effect=Effect.SIDE_EFFECTING, timeout=0.1)


def agent(script: dict[str, object], tool: Tool, store: keel.Store) -> keel.Agent:
    transport = ScriptedTransport.from_dict(script)
    return keel.Agent(transport, tools=[tool], approve_tools={"append_line"}, store=store)


async def test_the_timed_out_append_asked_twice_runs_once_and_the_second_asks_for_approval(
    tmp_path: Path,
) -> None:
    notes, finished = tmp_path / "notes.txt", threading.Event()
    append = call("append_line", text="hello")
    script = {"turns": [append, append, {"text": "done"}]}
    store = keel.Store(tmp_path / "runs.db")
    paused = await agent(script, slow_append(notes, finished), store).arun("add hello")
    assert finished.wait(5)  # the first append went on in its thread and happened
    assert paused.status == "awaiting_approval"
    (pending,) = paused.pending_approvals
    assert pending.call_id == "k2_0"
    assert pending.note is not None and "k1_0" in pending.note
    assert "may have happened" in pending.note
    (asked,) = [e for e in store.events(paused.run_id) if isinstance(e, ApprovalRequested)]
    assert asked.note == pending.note
    assert paused.to_dict()["pending_approvals"][0]["note"] == pending.note
    assert notes.read_text() == "hello\n"  # once: the second was not run by asking again
    first = [e for e in store.events(paused.run_id) if isinstance(e, ToolResultRecorded)]
    assert [r.uncertain for r in first] == [True]


async def test_a_person_may_still_run_the_identical_call_again(tmp_path: Path) -> None:
    notes, finished = tmp_path / "notes.txt", threading.Event()
    append = call("append_line", text="hello")
    script = {"turns": [append, append, {"text": "done"}]}
    store = keel.Store(tmp_path / "runs.db")
    runner = agent(script, slow_append(notes, finished), store)
    paused = await runner.arun("add hello")
    assert finished.wait(5)
    runner.approve(paused.run_id, "k2_0", by="tester")
    finished.clear()
    done = await runner.aresume(paused.run_id)
    assert done.status == "completed"
    assert finished.wait(5)
    assert notes.read_text() == "hello\nhello\n"  # the person chose to run it again


async def test_a_different_call_after_an_unknown_effect_runs_without_asking(
    tmp_path: Path,
) -> None:
    notes, finished = tmp_path / "notes.txt", threading.Event()
    script = {
        "turns": [
            call("append_line", text="hello"),
            call("append_line", text="other"),
            {"text": "done"},
        ]
    }
    store = keel.Store(tmp_path / "runs.db")
    result = await agent(script, slow_append(notes, finished), store).arun("add lines")
    assert result.status == "completed"
    assert not result.pending_approvals


async def test_the_web_view_shows_the_approver_that_the_first_may_have_happened(
    tmp_path: Path,
) -> None:
    from starlette.testclient import TestClient

    from keel.ui.app import create_app
    from keel.ui.security import served_hosts

    notes, finished = tmp_path / "notes.txt", threading.Event()
    append = call("append_line", text="hello")
    db = tmp_path / "runs.db"
    paused = await agent({"turns": [append, append]}, slow_append(notes, finished),
                         keel.Store(db)).arun("add hello")  # fmt: skip
    assert finished.wait(5)
    with TestClient(create_app(db, served_hosts("127.0.0.1", 8350)),
                    base_url="http://127.0.0.1:8350") as ui:  # fmt: skip
        page = ui.get(f"/runs/{paused.run_id}").text
    assert "may have happened already" in page
