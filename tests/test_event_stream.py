"""The typed event stream: `agent.stream(...)` and `keel run --events` give the caller the same
events, in the same order, that the store records and `keel show --json` prints; a slow
consumer never holds the run back."""

from __future__ import annotations

import asyncio
import io
import json
import time
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

import keel
from keel.cli.app import app
from keel.events import event_json, stream_lines
from keel.records import Event, RunCompleted, RunStarted
from support import call

runner = CliRunner()
ANSWER = {"text": "The notes say leases expire."}


@keel.tool
def note(topic: str) -> str:
    """Read a note."""
    return f"note on {topic}"


@keel.tool(effect="side_effecting", requires_approval=True)
def publish(text: str) -> str:
    """Publish text."""
    return "published"


def shown(store: Path, run_id: str) -> list[dict[str, Any]]:
    result = runner.invoke(app, ["show", run_id, "--json", "--store", str(store)])
    assert result.exit_code == 0, result.stderr
    events: list[dict[str, Any]] = json.loads(result.stdout)["events"]
    return events


def agent_for(turns: list[dict[str, Any]], store: keel.Store, **script: Any) -> keel.Agent:
    transport = keel.ScriptedTransport.from_dict({"turns": turns, **script})
    limits = keel.Limits(loop_threshold=3, retry_base_delay=0.001, retry_max_delay=0.01)
    return keel.Agent(transport, tools=[note, publish], store=store, limits=limits)


async def test_streamed_events_equal_in_order_what_keel_show_json_lists(tmp_path: Path) -> None:
    path = tmp_path / "runs.sqlite"
    store = keel.Store(path)
    turns = [
        call("note", topic="a"),
        {"error": {"status": 429, "message": "slow down"}},
        call("note", topic="a"),
        call("missing_tool"),
    ]
    agent = agent_for(turns, store, on_synthesis=ANSWER)
    stream = agent.stream("What do the notes say?")
    received: list[Event] = [event async for event in stream]
    result = await stream
    store.close()

    assert result.status == "completed" and result.synthesized == "repeated_tool"
    assert isinstance(received[0], RunStarted) and isinstance(received[-1], RunCompleted)
    assert [e.seq for e in received] == list(range(len(received)))
    assert {e.type for e in received} >= {
        "run_started",
        "model_request",
        "model_response",
        "model_error",
        "tool_call",
        "tool_result",
        "run_completed",
    }
    assert [event_json(e) for e in received] == shown(path, result.run_id)


async def test_a_paused_and_resumed_run_streams_every_event_it_records(tmp_path: Path) -> None:
    path = tmp_path / "runs.sqlite"
    store = keel.Store(path)
    agent = agent_for([call("publish", text="hi"), ANSWER], store)
    first = agent.stream("Publish it.")
    before = [event async for event in first]
    paused = await first
    assert paused.status == "awaiting_approval"
    agent.approve(paused.run_id, by="ana")  # recorded by the store, outside any run
    second = agent.stream_resume(paused.run_id)
    after = [event async for event in second]
    assert (await second).status == "completed"
    store.close()

    listed = shown(path, paused.run_id)
    decided = [e for e in listed if e["type"] == "approval_decided"]
    assert [event_json(e) for e in before] + decided + [event_json(e) for e in after] == listed


async def test_a_slow_consumer_never_holds_back_the_run_or_its_checkpoints(
    tmp_path: Path,
) -> None:
    path = tmp_path / "runs.sqlite"
    store = keel.Store(path)
    agent = agent_for([call("note", topic=str(i)) for i in range(20)] + [ANSWER], store)
    stream = agent.stream("Read twenty notes.")
    first = await anext(stream)
    # The consumer reads nothing more; the run must end, and save every step, on its own.
    result = await asyncio.wait_for(stream, 30)
    assert result.status == "completed" and result.tool_calls == 20
    saved = store.events(result.run_id)
    rest = [event async for event in stream]  # nothing was dropped while it lagged
    assert [event_json(e) for e in [first, *rest]] == [event_json(e) for e in saved]
    store.close()


def test_keel_run_events_prints_one_json_object_per_line_ending_with_the_result(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "notes.md").write_text("Leases expire.\n")
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": [call("read_file", path="notes.md"), ANSWER]}))
    store = tmp_path / "runs.sqlite"
    argv = ["run", "What do the notes say?", "--model", f"script:{script}", "--repo", str(repo)]
    result = runner.invoke(app, [*argv, "--store", str(store), "--events"])
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    parsed = [json.loads(line) for line in lines]  # every line is one JSON object
    *events, last = parsed
    assert last["type"] == "result" and last["status"] == "completed"
    assert last["answer"] == ANSWER["text"]
    assert events == shown(store, last["run_id"])
    assert result.stderr == ""  # no progress lines mixed in


async def test_a_slow_events_reader_never_slows_the_run(tmp_path: Path) -> None:
    class SlowOut(io.StringIO):
        def write(self, text: str) -> int:
            time.sleep(0.05)
            return super().write(text)

    out = SlowOut()
    listener, finish = stream_lines(out)
    transport = keel.ScriptedTransport.from_dict(
        {"turns": [call("note", topic=str(i)) for i in range(10)] + [ANSWER]}
    )
    store = keel.Store(":memory:")
    agent = keel.Agent(transport, tools=[note], store=store, listeners=[listener])
    started = time.monotonic()
    result = await agent.arun("Read ten notes.")
    ran = time.monotonic() - started
    written_during_run = len(out.getvalue().splitlines())
    await asyncio.to_thread(finish, result)
    events = store.events(result.run_id)
    lines = out.getvalue().splitlines()
    assert len(lines) == len(events) + 1 and json.loads(lines[-1])["type"] == "result"
    assert ran < len(events) * 0.05 / 2, f"the run took {ran:.2f}s: it waited for the reader"
    assert written_during_run < len(events)
