"""The repeat tiers of the loop policy (docs/adr/0050), each rule on the live loop (the scripted
model, real tools, a store) and through `keel replay` (the same loop, recorded turns)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from typer.testing import CliRunner

import keel
from keel._run.breaker import IdenticalCallBreaker, tier_of
from keel._run.synthesis import NUDGE_PREFIX, nudge_control
from keel.cli.app import app
from keel.errors import ToolError
from keel.records import RunConfig, ToolCallRequested
from keel.replay.playback import recorded_loops, replay
from keel.replay.recordings import Recorded, Recording
from support import call, run_script

READ = "read"


def calls(*turns: tuple[str, str, str, str], error: bool = False) -> Recording:
    """A recording from (tool, command, result, kind) turns, one call per turn."""
    return Recording(
        id="case",
        turns=tuple(
            (Recorded(tool, {"command": command}, result, kind, error=error),)
            for tool, command, result, kind in turns
        ),
    )


@keel.tool
def find_file(pattern: str) -> str:
    """Find a file by name."""
    return "No matches found."


@keel.tool
def read_page(page: str) -> str:
    """Read one page."""
    return f"the text of page {page}, unchanged"


@keel.tool
def open_file(path: str) -> str:
    """Open a file."""
    raise ToolError("Error: no such file")


@keel.tool(requires_approval=True)
def ask_person(question: str) -> str:
    """Ask a person."""
    return "noted"


def _requested(events: list[object]) -> int:
    return sum(isinstance(e, ToolCallRequested) for e in events)


# -- same_result ------------------------------------------------------------------------------


async def test_same_result_counts_one_tool_s_same_result_under_varied_arguments() -> None:
    turns = [("find_file", f"find_file Parser{n}", "nomatch", READ) for n in range(8)]
    out = await replay(calls(*turns), tiers=("same_result",))
    assert out.synthesis_after == 3 and out.tier == "same_result"  # the 4th call: T-1 = 4
    assert out.hard_limit_at == 4
    off = await replay(calls(*turns), tiers=())
    assert off.synthesis_after is None and off.hard_limit_at is None


async def test_same_result_restarts_when_a_side_effect_runs_in_between() -> None:
    turns = []
    for n in range(8):
        turns.append(("find_file", f"find_file Parser{n}", "nomatch", READ))
        if n % 3 == 2:
            turns.append(("edit", f"edit {n}", f"edited {n}", "write"))
    out = await replay(calls(*turns), tiers=("same_result",))
    assert out.synthesis_after is None


async def test_same_result_does_not_cut_a_log_of_appends(tmp_path: Path) -> None:
    """Keel's write_file appending entries (the fault suite's run): each append says what the
    file now holds, so no two results are the same and the tier sees work, not a loop. Before,
    every append answered "appended 8 characters to log.txt" and the fourth brought the
    synthesis turn."""
    from keel.tools.writes import write_tools

    appends = [
        call("write_file", path="log.txt", content=f"entry {n}\n", append=True) for n in range(6)
    ]
    script = {"turns": [*appends, {"text": "Logged."}], "on_synthesis": {"text": "Cut."}}
    (write,) = write_tools(tmp_path)
    unasked = dataclasses.replace(write, requires_approval=False)  # approved, as in the suite
    out = await run_script(script, [unasked], repeat_same_result=True)
    assert out.result.synthesized is None and out.result.answer == "Logged."
    assert (tmp_path / "log.txt").read_text().count("entry") == 6


async def test_same_result_restarts_when_another_call_s_result_changed() -> None:
    """A write whose own result never changes, and a read after it that does: the world
    changed, so the write's same result is not a loop (a real edit-and-reread)."""
    turns = []
    for n in range(6):
        turns.append(("write", f"write v{n}", "wrote 10 bytes", "write"))
        turns.append(("cat", "cat notes", f"v{n}", READ))
    out = await replay(calls(*turns), tiers=("same_result",))
    assert out.synthesis_after is None


async def test_same_result_on_the_live_loop_brings_the_synthesis_turn() -> None:
    turns = [call("find_file", pattern=f"JsonParser{n}") for n in range(6)]
    script = {"turns": [*turns, {"text": "Done."}], "on_synthesis": {"text": "Not found."}}
    out = await run_script(script, [find_file], repeat_same_result=True)
    assert out.result.synthesized == "repeated_tool"
    assert _requested(out.events) == 4
    off = await run_script(script, [find_file], repeat_same_result=False)
    assert off.result.synthesized is None and _requested(off.events) == 6


# -- alternation ------------------------------------------------------------------------------


async def test_alternation_brings_the_synthesis_turn_after_three_full_cycles() -> None:
    turns = [("open", f"open {p}", f"page {p}", READ) for p in "abababab"]
    out = await replay(calls(*turns), tiers=("alternation",))
    assert out.synthesis_after == 5 and out.tier == "alternation"  # six calls, A B A B A B
    identical = await replay(calls(*turns), tiers=())
    assert identical.synthesis_after == 6 and identical.tier == "identical"  # seven calls


async def test_alternation_of_three_calls_counts_each_call_that_repeats_one_cycle_back() -> None:
    turns = [("open", f"open {p}", f"page {p}", READ) for p in "abcabcabcabc"]
    out = await replay(calls(*turns), tiers=("alternation",))
    assert out.synthesis_after == 6 and out.tier == "alternation"  # A B C A B C A: 4 repeats
    identical = await replay(calls(*turns), tiers=())
    assert identical.synthesis_after == 9


async def test_alternation_ends_when_a_result_changes() -> None:
    results = ["a1", "b", "a1", "b", "a2", "b", "a2", "b"]
    turns = [("open", f"open {'ab'[n % 2]}", r, READ) for n, r in enumerate(results)]
    out = await replay(calls(*turns), tiers=("alternation",), policy="adr")
    assert out.tier != "alternation"


async def test_alternation_on_the_live_loop_brings_the_synthesis_turn() -> None:
    turns = [call("read_page", page=p) for p in "abababab"]
    script = {"turns": [*turns, {"text": "Done."}], "on_synthesis": {"text": "The pages."}}
    out = await run_script(script, [read_page], repeat_alternation=True)
    assert out.result.synthesized == "repeated_tool" and _requested(out.events) == 6
    off = await run_script(script, [read_page], repeat_alternation=False)
    assert off.result.synthesized == "repeated_tool" and _requested(off.events) == 7


# -- same_error -------------------------------------------------------------------------------


async def test_same_error_counts_one_tool_failing_alike_under_varied_arguments() -> None:
    turns = [("open", f"open F{n}.java", "nosuchfile", "run") for n in range(8)]
    out = await replay(calls(*turns, error=True), tiers=("same_error",))
    assert out.synthesis_after == 3 and out.tier == "same_error"
    assert dict(out.loops)["same_error"] == 7
    off = await replay(calls(*turns, error=True), tiers=())
    assert off.synthesis_after is None


async def test_same_error_on_the_live_loop_brings_the_synthesis_turn() -> None:
    turns = [call("open_file", path=f"src/F{n}.java") for n in range(6)]
    script = {"turns": [*turns, {"text": "Done."}], "on_synthesis": {"text": "Missing."}}
    out = await run_script(script, [open_file], repeat_same_error=True)
    assert out.result.synthesized == "repeated_tool" and _requested(out.events) == 4
    off = await run_script(script, [open_file])  # off under progress: the data has no errors
    assert off.result.synthesized is None and _requested(off.events) == 6


# -- the rules of every tier --------------------------------------------------------------------


def test_each_tier_is_on_or_off_by_name_and_progress_gains_the_measured_ones() -> None:
    assert keel.Limits().repeat_tiers == ("alternation",)  # same_result by name (ADR 0064)
    assert keel.Limits(loop_policy="adr").repeat_tiers == ()
    assert keel.Limits(repeat_same_result=True).repeat_tiers == ("same_result", "alternation")
    assert keel.Limits(repeat_alternation=False).repeat_tiers == ()
    assert keel.Limits(loop_policy="adr", repeat_same_error=True).repeat_tiers == ("same_error",)


def test_the_tiers_are_saved_as_they_were_in_force() -> None:
    saved = keel.Limits().to_dict()
    assert saved["repeat_same_result"] is False and saved["repeat_alternation"] is True
    assert keel.Limits(repeat_same_result=True).to_dict()["repeat_same_result"] is True
    old = RunConfig.decode({"model": "script:x", "system_prompt": "", "limits": {}})
    assert old.limits.repeat_tiers == ()  # saved before the tiers: resumes without them


async def test_a_tier_count_is_checkpointed_and_continues_on_resume(tmp_path: Path) -> None:
    """Two finds, a pause for a person, a resume in a fresh agent, two more finds: the chain
    stood at 2 in the store and reaches T-1 with the fourth find."""
    db = tmp_path / "runs.sqlite"
    finds = [call("find_file", pattern=f"Parser{n}") for n in range(4)]
    script = {
        "turns": [*finds[:2], call("ask_person", question="where?"), *finds[2:], {"text": "ok"}],
        "on_synthesis": {"text": "Not found."},
    }

    def agent() -> keel.Agent:
        return keel.Agent(
            keel.ScriptedTransport.from_dict(script),
            tools=[find_file, ask_person],
            store=keel.Store(db),
            limits=keel.Limits(repeat_same_result=True),
        )

    first = agent()
    paused = await first.arun("Find the parser.")
    assert paused.status == "awaiting_approval"
    stored = keel.Store(db).counters(paused.run_id)
    assert stored["~same_result find_file"].count == 2
    first.approve(paused.run_id, paused.pending_approvals[0].call_id, by="ana")
    resumed = await agent().aresume(paused.run_id)
    assert resumed.synthesized == "repeated_tool"
    shown = CliRunner().invoke(app, ["show", paused.run_id, "--json", "--store", str(db)])
    assert json.loads(shown.stdout)["loop_rules"]["tiers"] == ["same_result", "alternation"]
    text = CliRunner().invoke(
        app, ["show", paused.run_id, "--store", str(db)], env={"COLUMNS": "240"}
    )
    assert "tiers same_result, alternation" in text.stdout


def test_tier_counters_have_keys_no_call_can_have() -> None:
    breaker = IdenticalCallBreaker(5, 3, tiers=("same_result",))
    breaker.answered("find_file {}", "find_file", "d", error=False, empty=False, side_effect=False)
    (key,) = breaker.counters
    assert tier_of(key) == "same_result" and tier_of("find_file {}") is None


def test_an_empty_result_is_never_the_same_result() -> None:
    breaker = IdenticalCallBreaker(3, 3, tiers=("same_result",))
    for n in range(4):
        breaker.answered(f"ls {n}", "ls", "e", error=False, empty=True, side_effect=False)
    assert breaker.synthesis_key() is None


def test_the_replay_names_each_loop_by_its_own_definition() -> None:
    turns = [("find_file", f"find_file P{n}", "nomatch", READ) for n in range(5)]
    turns += [("open", f"open {p}", f"page {p}", READ) for p in "ababab"]
    found = dict(recorded_loops(calls(*turns)))
    assert found == {"same_result": 4, "alternation": 10}


def test_keel_replay_json_names_the_tier_that_triggered(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    turns = [
        [
            {
                "tool": "find_file",
                "arguments": {"command": f"find_file P{n}"},
                "kind": "nav",
                "result_digest": "aaaa",
                "result_chars": 17,
            }
        ]
        for n in range(6)
    ]
    path.write_text(json.dumps({"id": "r1", "turns": turns, "resolved": False}) + "\n")
    out = CliRunner().invoke(app, ["replay", str(path), "--json", "--tiers", "same_result"])
    assert out.exit_code == 0, out.output
    row = json.loads(out.stdout)
    assert row["tier"] == "same_result" and row["tiers"] == ["same_result"]
    policy = CliRunner().invoke(app, ["replay", str(path), "--json"])
    assert json.loads(policy.stdout)["tiers"] == ["alternation"]  # same_result by name only
    none = CliRunner().invoke(app, ["replay", str(path), "--json", "--tiers", "none"])
    assert json.loads(none.stdout)["tier"] is None
    bad = CliRunner().invoke(app, ["replay", str(path), "--tiers", "same_results"])
    assert bad.exit_code == 2


# -- the nudge --------------------------------------------------------------------------------


async def test_the_nudge_names_the_tool_at_t_minus_2_and_is_never_stored() -> None:
    turns = [call("find_file", pattern=f"JsonParser{n}") for n in range(3)]
    script = {"turns": [*turns, {"text": "Not there."}], "on_synthesis": {"text": "Stopped."}}
    out = await run_script(script, [find_file], nudge=True, repeat_same_result=True)
    notes = [v for r in out.requests for v in r.volatile if v.startswith(NUDGE_PREFIX)]
    assert notes == [nudge_control("find_file")]  # once, after the third call (T-2 = 3)
    assert "JsonParser" not in notes[0] and "No matches" not in notes[0]
    assert out.result.synthesized is None  # it changed course: no synthesis turn
    stored = json.dumps([str(e) for e in out.events])
    assert NUDGE_PREFIX not in stored
    off = await run_script(script, [find_file], nudge=False, repeat_same_result=True)
    assert not [v for r in off.requests for v in r.volatile if v.startswith(NUDGE_PREFIX)]


async def test_the_replay_counts_where_the_nudge_would_come() -> None:
    turns = [("find_file", f"find_file P{n}", "nomatch", READ) for n in range(8)]
    out = await replay(calls(*turns), nudge=True, tiers=("same_result",))
    assert out.nudge_after == 2 and out.synthesis_after == 3
    assert (await replay(calls(*turns), tiers=("same_result",))).nudge_after is None


def test_nudge_is_an_option_of_its_own() -> None:
    from keel.run_options import OPTIONS

    (nudge,) = [o for o in OPTIONS if o.name == "nudge"]
    assert nudge.flag_name == "--nudge" and nudge.default is False
