"""Forks (ADR 0051): a run forked at a step copies its first steps from the store, sends nothing
to a model and runs no tool for them, stands where the original stood, and goes on live."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import keel
from keel._run.fork import prefix_of_run
from keel.errors import ConfigError
from keel.records import (
    ModelResponseReceived,
    RunResumed,
    ToolResultRecorded,
)
from keel.replay.forks import fork_recording
from keel.tools.base import Effect, Tool, make_tool
from keel.transports.scripted import ScriptedTransport
from support import call


class Counted:
    """Tools that count how often they ran: `look` reads, `note` writes (side-effecting)."""

    def __init__(self) -> None:
        self.runs: list[str] = []
        self.notes: list[str] = []

    def tools(self) -> list[Tool]:
        def look(topic: str) -> str:
            """Look a topic up."""
            self.runs.append(f"look {topic}")
            return f"what is known about {topic}"

        def note(text: str) -> str:
            """Write a note down."""
            self.runs.append(f"note {text}")
            self.notes.append(text)
            return f"{len(self.notes)} notes"

        return [make_tool(look), make_tool(note, effect=Effect.SIDE_EFFECTING)]


def scripted(turns: list[dict[str, Any]], synthesis: str = "synthesized") -> ScriptedTransport:
    return ScriptedTransport.from_dict(
        {"turns": turns, "on_synthesis": {"text": synthesis}}, record=True
    )


def agent(
    transport: ScriptedTransport, tools: Counted, store: keel.Store, **limits: Any
) -> keel.Agent:
    return keel.Agent(
        transport,
        tools=tools.tools(),
        approve_tools={"note"},
        store=store,
        limits=keel.Limits(**limits),
    )


ORIGINAL = [
    call("look", topic="leases"),
    call("note", text="leases expire"),
    call("look", topic="leases"),
    call("look", topic="checkpoints"),
    {"text": "A's answer"},
]


async def original_run(tmp_path: Path) -> tuple[keel.Store, keel.RunResult, Counted]:
    store = keel.Store(tmp_path / "runs.db")
    tools = Counted()
    result = await agent(scripted(ORIGINAL), tools, store).arun("How do leases work?")
    assert result.status == "completed" and len(tools.runs) == 4
    return store, result, tools


async def test_a_fork_makes_no_model_call_and_no_tool_call_for_its_prefix(tmp_path: Path) -> None:
    store, original, tools = await original_run(tmp_path)
    before = store.events(original.run_id)
    model_b = scripted([{"text": "B's answer"}])
    fork = await agent(model_b, tools, store).afork(original.run_id, at=4)
    assert fork.status == "completed" and fork.answer == "B's answer"
    assert len(model_b.requests) == 1  # only the live turn reached the transport
    assert len(tools.runs) == 4  # no tool ran again
    assert tools.notes == ["leases expire"]  # the side effect happened once
    # the one request B got holds the prefix: the question, four calls and their results
    sent = model_b.requests[0]
    results = [i for i in sent.items if isinstance(i, keel.ToolResult)]
    assert [r.content for r in results] == [  # each with its citable id (ADR 0053)
        "[r1] what is known about leases",
        "[r2] 1 notes",
        "[r3] what is known about leases",
        "[r4] what is known about checkpoints",
    ]
    # the fork's record: the original's steps copied, then the live step
    events = store.events(fork.run_id)
    copied = [e for e in events if e.step <= 4 and not isinstance(e, RunResumed)]
    originals = [e for e in before if e.step <= 4]
    assert [(type(e), e.step) for e in copied] == [(type(e), e.step) for e in originals]
    assert [e.seq for e in copied] == list(range(len(copied)))
    answers = [e for e in events if isinstance(e, ModelResponseReceived) and e.step == 5]
    assert [a.text for a in answers] == ["B's answer"]
    # the original is untouched
    assert store.events(original.run_id) == before
    assert fork.forked_from == {"run_id": original.run_id, "step": 4}
    assert fork.to_dict()["forked_from"] == {"run_id": original.run_id, "step": 4}
    assert fork.model_calls == 5 and fork.tool_calls == 4


async def test_counters_after_the_prefix_equal_the_originals_at_that_step(tmp_path: Path) -> None:
    store, original, _ = await original_run(tmp_path)
    stored = store.get_run(original.run_id)
    assert stored is not None
    at_last = prefix_of_run(store, original.run_id, 4)  # the last step before the answer
    assert at_last.counters == store.counters(original.run_id)
    mine, theirs = at_last.state, stored.state
    assert (mine.model_calls, mine.tool_calls, mine.usage, mine.cost, mine.world) == (
        theirs.model_calls - 1,  # the answer's turn is not in the prefix
        theirs.tool_calls,
        usage_through(store, original.run_id, 4),
        theirs.cost,
        theirs.world,
    )
    assert mine.world == 1  # the note (a side effect with a new result) moved the world
    # at step 3: as a run cut there would have stood (the same script, stopped after 3 steps)
    cut = keel.Store(tmp_path / "cut.db")
    three = await agent(scripted(ORIGINAL[:3]), Counted(), cut).arun("How do leases work?")
    at_three = prefix_of_run(store, original.run_id, 3)
    assert at_three.counters == cut.counters(three.run_id)
    assert at_three.state.world == cut.get_run(three.run_id).state.world  # type: ignore[union-attr]


def usage_through(store: keel.Store, run_id: str, step: int) -> keel.Usage:
    total = keel.Usage()
    for event in store.events(run_id):
        if isinstance(event, ModelResponseReceived) and event.step <= step:
            total = total + event.usage
    return total


async def test_a_loop_one_call_from_synthesis_is_still_one_call_from_it_in_the_fork(
    tmp_path: Path,
) -> None:
    store = keel.Store(tmp_path / "runs.db")
    tools = Counted()
    same = call("look", topic="leases")
    original = await agent(scripted([same] * 4, "A's synthesis"), tools, store).arun("q?")
    assert original.synthesized == "repeated_tool"  # T = 5: four calls, then synthesis
    model_b = scripted([same, {"text": "not synthesized"}], "B's synthesis")
    fork = await agent(model_b, tools, store).afork(original.run_id, at=4)
    assert fork.answer == "B's synthesis" and fork.synthesized == "repeated_tool"
    assert [r.tool_choice for r in model_b.requests] == ["none"]  # its first turn is synthesis
    assert len(tools.runs) == 4
    # one step earlier the loop is two calls from it: one live call, then synthesis
    model_c = scripted([same, {"text": "not synthesized"}], "C's synthesis")
    earlier = await agent(model_c, tools, store).afork(original.run_id, at=3)
    assert earlier.answer == "C's synthesis"
    assert [r.tool_choice for r in model_c.requests] == [None, "none"]
    assert len(tools.runs) == 5  # the one live call


async def test_a_fork_runs_under_its_own_limits_from_where_the_original_stood(
    tmp_path: Path,
) -> None:
    store, original, tools = await original_run(tmp_path)
    model_b = scripted([call("look", topic="more"), {"text": "B"}], "B within budget")
    fork = await agent(model_b, tools, store, max_model_calls=5).afork(original.run_id, at=3)
    # three calls spent in the prefix, five allowed: one normal turn, then the budget's synthesis
    assert fork.synthesized == "budget" and fork.answer == "B within budget"
    assert [r.tool_choice for r in model_b.requests] == [None, "none"]
    record = store.get_run(fork.run_id)
    assert record is not None and record.config.limits.max_model_calls == 5


def slow_append(path: Path, finished: threading.Event) -> Tool:
    def append_line(text: str) -> str:
        """Append a line to the notes file."""
        time.sleep(0.4)  # longer than its timeout: it goes on in its thread after the timeout
        with path.open("a") as file:
            file.write(text + "\n")
        finished.set()
        return "appended"

    return make_tool(append_line, effect=Effect.SIDE_EFFECTING, timeout=0.1)


async def test_an_effect_unknown_call_in_the_prefix_needs_approval_in_the_fork(
    tmp_path: Path,
) -> None:
    notes, finished = tmp_path / "notes.txt", threading.Event()
    store = keel.Store(tmp_path / "runs.db")
    append = call("append_line", text="hello")
    tool = slow_append(notes, finished)

    def runner(turns: list[dict[str, Any]]) -> tuple[keel.Agent, ScriptedTransport]:
        transport = scripted(turns)
        return keel.Agent(transport, tools=[tool], approve_tools={"append_line"}, store=store), (
            transport
        )

    first, _ = runner([append, {"text": "it may have been appended"}])
    original = await first.arun("add hello")
    assert finished.wait(5)
    (result,) = [e for e in store.events(original.run_id) if isinstance(e, ToolResultRecorded)]
    assert result.uncertain  # timed out: its effect is unknown
    forker, model_b = runner([append, {"text": "done"}])
    fork = await forker.afork(original.run_id, at=1)
    assert fork.status == "awaiting_approval"  # pre-approved, yet a person must decide
    (pending,) = fork.pending_approvals
    assert pending.call_id == "k2_0" and pending.note is not None and "k1_0" in pending.note
    assert notes.read_text() == "hello\n"  # not run again
    assert len(model_b.requests) == 1
    # the fork is a run like any: approve and resume it
    forker.approve(fork.run_id, "k2_0", by="tester")
    finished.clear()
    done = await forker.aresume(fork.run_id)
    assert done.status == "completed" and done.forked_from == fork.forked_from
    assert finished.wait(5)


async def test_a_fork_of_a_fork(tmp_path: Path) -> None:
    store, original, tools = await original_run(tmp_path)
    model_b = scripted([call("look", topic="fencing"), {"text": "B's answer"}])
    fork = await agent(model_b, tools, store).afork(original.run_id, at=2)
    assert len(tools.runs) == 5  # B's one live call
    model_c = scripted([{"text": "C's answer"}])
    second = await agent(model_c, tools, store).afork(fork.run_id, at=3)
    assert second.answer == "C's answer" and len(model_c.requests) == 1
    assert len(tools.runs) == 5
    results = [i.content for i in model_c.requests[0].items if isinstance(i, keel.ToolResult)]
    assert results == [  # the original's two steps, then B's live one, numbered on
        "[r1] what is known about leases",
        "[r2] 1 notes",
        "[r3] what is known about fencing",
    ]
    assert second.forked_from == {
        "run_id": fork.run_id,
        "step": 3,
        "from": {"run_id": original.run_id, "step": 2},
    }


async def test_steps_that_cannot_be_forked_at_are_refused_by_name(tmp_path: Path) -> None:
    store, original, tools = await original_run(tmp_path)
    forker = agent(scripted([{"text": "B"}]), tools, store)
    with pytest.raises(ConfigError, match="the answer that ended it"):
        await forker.afork(original.run_id, at=5)
    with pytest.raises(ConfigError, match="no step 9"):
        await forker.afork(original.run_id, at=9)
    with pytest.raises(ConfigError, match="no run run_nope"):
        await forker.afork("run_nope", at=1)
    fresh = await forker.afork(original.run_id, at=0)  # the question alone: a fresh start
    assert fresh.answer == "B" and fresh.model_calls == 1


def write_trajectory(path: Path) -> None:
    same = {"tool": "find_file", "arguments": {"command": 'find_file "Json.java"'},
            "kind": "read", "result_digest": "aaaa", "source_write": False}  # fmt: skip
    line = {"corpus": "test", "model": "gpt-x", "id": "repo__1", "resolved": False,
            "turns": [[same], [same], [same], [same], [same]]}  # fmt: skip
    other = {**line, "id": "repo__2", "turns": [[same]]}
    path.write_text(json.dumps(line) + "\n" + json.dumps(other) + "\n")


async def test_a_fork_from_a_shared_format_recording(tmp_path: Path) -> None:
    recording = tmp_path / "runs.jsonl"
    write_trajectory(recording)
    store = keel.Store(tmp_path / "runs.db")
    model_b = scripted([{"text": "not synthesized"}], "B's synthesis")
    forker = keel.Agent(model_b, store=store)
    fork = await asyncio_thread(
        lambda: fork_recording(forker, recording, id="repo__1", at=4, question="Find Json.java")
    )
    # four identical recorded calls: Keel would have asked for synthesis next
    assert fork.synthesized == "repeated_tool" and fork.answer == "B's synthesis"
    assert [r.tool_choice for r in model_b.requests] == ["none"]
    assert fork.forked_from == {"recording": str(recording), "id": "repo__1", "step": 4}
    results = [i for i in model_b.requests[0].items if isinstance(i, keel.ToolResult)]
    assert len(results) == 4 and "aaaa" in results[0].content
    with pytest.raises(ConfigError, match="--question"):
        fork_recording(forker, recording, id="repo__1", at=1)


async def test_a_fork_from_a_chat_message_list(tmp_path: Path) -> None:
    messages = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Where is the lease renewed?"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "grep", "arguments": "{\"pattern\": \"renew\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "lease.py:62: renew_lease"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_2", "type": "function",
             "function": {"name": "read", "arguments": "{\"path\": \"lease.py\"}"}}]},
        {"role": "tool", "tool_call_id": "call_2", "content": "def _beat(self): ..."},
        {"role": "assistant", "content": "In lease.py, _beat."},
    ]  # fmt: skip
    recording = tmp_path / "chat.json"
    recording.write_text(json.dumps(messages))
    store = keel.Store(tmp_path / "runs.db")
    model_b = scripted([{"text": "Keel with B: lease.py renews it in _beat."}])
    forker = keel.Agent(model_b, store=store)
    fork = await asyncio_thread(lambda: fork_recording(forker, recording, id=None, at=2))
    assert fork.answer == "Keel with B: lease.py renews it in _beat."
    (sent,) = model_b.requests
    users = [i for i in sent.items if isinstance(i, keel.UserMessage)]
    assert [u.text for u in users] == ["Where is the lease renewed?"]
    results = [i.content for i in sent.items if isinstance(i, keel.ToolResult)]
    assert results == ["[r1] lease.py:62: renew_lease", "[r2] def _beat(self): ..."]
    calls = [c for i in sent.items if isinstance(i, keel.AssistantMessage) for c in i.tool_calls]
    assert [(c.name, c.arguments) for c in calls] == [
        ("grep", {"pattern": "renew"}),
        ("read", {"path": "lease.py"}),
    ]
    assert fork.model_calls == 3 and fork.tool_calls == 2


async def asyncio_thread(work: Any) -> Any:
    """`fork_recording` blocks (asyncio.run): run it off this test's event loop."""
    import asyncio

    return await asyncio.to_thread(work)


def keel_cli(*args: str) -> tuple[int, str, str]:
    from typer.testing import CliRunner

    from keel.cli.app import app

    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def script_file(path: Path, data: dict[str, Any]) -> str:
    path.write_text(json.dumps(data))
    return f"script:{path}"


def test_keel_fork_at_the_synthesis_point_onto_another_model(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "notes.md").write_text("The breaker counts identical calls.\n")
    read = {"tool_calls": [{"name": "read_file", "arguments": {"path": "notes.md"}}]}
    model_a = script_file(
        tmp_path / "a.json", {"turns": [read] * 4, "on_synthesis": {"text": "A: it counts."}}
    )
    model_b = script_file(
        tmp_path / "b.json", {"turns": [], "on_synthesis": {"text": "B: identical calls."}}
    )
    store = str(tmp_path / "runs.sqlite")
    common = ("--repo", str(repo), "--store", store, "--json")
    code, out, _ = keel_cli("run", "What does the breaker count?", "--model", model_a, *common)
    original = json.loads(out)
    assert code == 0 and original["synthesized"] == "repeated_tool"
    code, out, err = keel_cli("fork", original["run_id"], "--at", "4", "--model", model_b, *common)
    assert code == 0, err
    forked = json.loads(out)
    assert forked["answer"] == "B: identical calls." and forked["synthesized"] == "repeated_tool"
    assert forked["forked_from"] == {"run_id": original["run_id"], "step": 4}
    assert (forked["model_calls"], forked["tool_calls"]) == (5, 4)
    code, out, _ = keel_cli("show", forked["run_id"], "--json", "--store", store)
    shown = json.loads(out)
    assert shown["forked_from"] == forked["forked_from"] and shown["run"] == forked
    code, out, _ = keel_cli("show", forked["run_id"], "--store", store)
    assert f"forked from run {original['run_id']} at step 4" in out
    # the original is as it was
    code, out, _ = keel_cli("show", original["run_id"], "--json", "--store", store)
    assert json.loads(out)["run"] == original and json.loads(out)["forked_from"] is None
    # a step that cannot be forked at: one line, exit code 2
    code, out, err = keel_cli("fork", original["run_id"], "--at", "5", *common)
    assert code == 2 and "the answer that ended it" in err + out


def test_the_compare_table_for_two_scripted_models(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "notes.md").write_text("The breaker counts identical calls.\n")
    read = {"tool_calls": [{"name": "read_file", "arguments": {"path": "notes.md"}}]}
    model_a = script_file(
        tmp_path / "a.json", {"turns": [read] * 4, "on_synthesis": {"text": "A: it counts."}}
    )
    model_b = script_file(
        tmp_path / "b.json", {"turns": [], "on_synthesis": {"text": "It counts identical calls."}}
    )
    model_c = script_file(
        tmp_path / "c.json",
        {"turns": [], "on_synthesis": {"text": "No idea."}},
    )
    store = str(tmp_path / "runs.sqlite")
    code, out, _ = keel_cli(
        "run", "What does the breaker count?", "--model", model_a, "--repo", str(repo),
        "--store", store, "--json",
    )  # fmt: skip
    original = json.loads(out)["run_id"]
    compare = ("eval", "--fork", original, "--at", "4", "--model", model_b, "--model", model_c,
               "--repeat", "2", "--store", store)  # fmt: skip
    code, out, err = keel_cli(*compare, "--json")
    assert code == 0, err
    table = json.loads(out)
    assert table["forked_from"] == {"run_id": original, "step": 4}
    assert table["prefix"] == {"model_calls": 4, "tool_calls": 4}
    assert table["baseline"] == model_b
    base, other = table["models"]
    assert [m["model"] for m in table["models"]] == [model_b, model_c]
    assert base["summary"]["runs"] == 2 and len(base["runs"]) == 2
    assert base["summary"]["answer"] == "It counts identical calls."
    assert base["summary"]["synthesized"] == {"repeated_tool": 2}
    assert base["summary"]["model_calls"] == 1 and base["summary"]["tool_calls"] == 0
    assert base["vs_baseline"] is None
    assert other["summary"]["answer"] == "No idea."
    assert other["vs_baseline"]["same_answer"] is False
    assert other["vs_baseline"]["same_synthesized"] is True
    assert other["vs_baseline"]["model_calls"] == 0
    # every fork is a run of its own in the store, the original untouched
    runs = {r["run_id"] for m in table["models"] for r in m["runs"]}
    assert len(runs) == 4
    code, out, _ = keel_cli("show", original, "--json", "--store", store)
    assert json.loads(out)["run"]["answer"] == "A: it counts."
    code, out, _ = keel_cli(*compare)
    assert code == 0
    assert "baseline" in out and "answer differs" in out and "No idea." in out


async def test_a_fork_of_a_parent_runs_none_of_its_finished_children_again(tmp_path: Path) -> None:
    from keel.tools.files import file_tools

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "a.md").write_text("alpha\n")
    child_turns = {"turns": [call("read_file", path="a.md"), {"text": "A says alpha."}]}
    child_model = script_file(tmp_path / "child.json", child_turns)
    reader = keel.Agent(child_model, tools=file_tools(repo), limits=keel.Limits(max_model_calls=5))
    store = keel.Store(tmp_path / "runs.db")
    parent = keel.Agent(
        scripted([call("reader", task="What does a.md say?"), {"text": "It says alpha."}]),
        tools=[reader.as_tool("reader", "Reads files")],
        store=store,
    )
    original = await parent.arun("What does a.md say?")
    (child,) = original.children
    runs_before = store.count_runs()
    model_b = scripted([{"text": "B: alpha."}])
    forker = keel.Agent(model_b, tools=[reader.as_tool("reader", "Reads files")], store=store)
    fork = await forker.afork(original.run_id, at=1)
    assert fork.answer == "B: alpha." and len(model_b.requests) == 1
    assert store.count_runs() == runs_before + 1  # the fork alone: no child run again
    assert [c.run_id for c in fork.children] == [child.run_id]  # the original's child, named
    assert (fork.model_calls, fork.tool_calls) == (original.model_calls, original.tool_calls)
    results = [i.content for i in model_b.requests[0].items if isinstance(i, keel.ToolResult)]
    assert results == ["[r1] A says alpha."]


async def test_fk01_a_fork_asks_again_for_a_call_approved_but_not_run_in_the_original(
    tmp_path: Path,
) -> None:
    """FK-01: the original paused on a write, a person approved it, nobody resumed it yet.
    The fork ran the write without asking, and the original's resume wrote again: one
    approval, two writes. The fork is a run of its own: it asks again (ADR 0051)."""
    store = keel.Store(tmp_path / "runs.db")
    notes: list[str] = []

    def note(text: str) -> str:
        """Write a note down."""
        notes.append(text)
        return f"{len(notes)} notes"

    asks = make_tool(note, effect=Effect.SIDE_EFFECTING, requires_approval=True)
    turns = [call("note", text="once"), {"text": "noted"}]
    paused = await keel.Agent(scripted(turns), tools=[asks], store=store).arun("Note it")
    assert paused.status == "awaiting_approval"
    (pending,) = paused.pending_approvals
    store.decide(paused.run_id, pending.call_id, approved=True, by="ana")
    forker = keel.Agent(scripted([{"text": "fork's answer"}]), tools=[asks], store=store)
    fork = await forker.afork(paused.run_id, at=1)
    assert fork.status == "awaiting_approval", fork.failure
    assert [p.call_id for p in fork.pending_approvals] == [pending.call_id]
    assert notes == []  # the approval was for the original's call, not the fork's
    resumed = await keel.Agent(scripted(turns), tools=[asks], store=store).aresume(paused.run_id)
    assert resumed.status == "completed" and notes == ["once"], resumed.failure
