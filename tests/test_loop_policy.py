"""The loop policies (docs/adr/0029), each rule through the real run loop: recorded turns played
by `keel.replay` (the loop, a model that asks for the recorded calls, tools that answer with the
recorded results), and live runs with the scripted model and real tools for what is stored."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import keel
from keel._run.breaker import WORLD_RESET_CAP
from keel.cli.app import app
from keel.records import EvidenceReset, RunConfig
from keel.replay.playback import replay
from keel.replay.recordings import Recorded, Recording
from keel.run_options import resolve_one
from support import call, run_script

READ = "read"
RUN = "run"


def calls(*turns: tuple[str, str, str, str]) -> Recording:
    """A recording from (tool, command, result, kind) turns, one call per turn."""
    return Recording(
        id="case",
        turns=tuple(
            (Recorded(tool, {"command": command}, result, kind),)
            for tool, command, result, kind in turns
        ),
    )


async def test_progress_counts_an_identical_call_whose_result_the_model_already_has() -> None:
    """The commissioning incident: the same document again and again, other reads between,
    nothing changed, the same result: synthesis after the 4th identical request."""
    turns = []
    for n in range(6):
        turns.append(("fetch", "doc", "same", READ))
        turns.append(("fetch", f"other {n}", f"r{n}", READ))
    out = await replay(calls(*turns), policy="progress")
    assert out.synthesis_after == 6  # the 4th fetch of doc is turn 6
    assert out.key is not None and '"doc"' in out.key


async def test_progress_restarts_a_key_when_a_side_effect_changed_the_world() -> None:
    """Edit, run the same script, edit again, run again: each run follows a change."""
    turns = []
    for n in range(12):
        turns.append(("edit", f"edit {n}", f"edited {n}", "write"))
        turns.append(("bash", "python reproduce.py", "fails" if n < 11 else "passes", RUN))
    out = await replay(calls(*turns), policy="progress")
    assert out.synthesis_after is None and out.hard_limit_at is None
    adr = await replay(calls(*turns), policy="adr")
    assert adr.synthesis_after == 7  # the ADR's counting: the 4th identical run


async def test_progress_counts_side_effects_that_repeat_their_last_result() -> None:
    """A two-step loop of side effects that change nothing: the same failing edit and the same
    test output each time. Nothing new happened, so both keys count."""
    turns = []
    for _ in range(6):
        turns.append(("edit", "the same edit", "no match for old_str", "write"))
        turns.append(("bash", "pytest", "1 failed", RUN))
    out = await replay(calls(*turns), policy="progress")
    assert out.synthesis_after is not None and out.synthesis_after <= 8


async def test_progress_counts_a_repeated_failing_call_with_the_same_error() -> None:
    turns = [("find_file", "JsonParser", "No matches found", READ)] * 6
    out = await replay(calls(*turns), policy="progress")
    assert out.synthesis_after == 3 and out.hard_limit_at == 4


async def test_progress_caps_restarts_by_a_changed_result() -> None:
    """A result that changes by itself every time (a ticking clock) restarts its counter at
    most R times; then the counter grows as usual and the run reaches synthesis."""
    turns = [("date", "date", f"tick {n}", READ) for n in range(12)]
    out = await replay(calls(*turns), policy="progress", reset_cap=3)
    # counts 1; three restarts (turns 1-3); then 2, 3, 4 = T-1 at turn 6
    assert out.synthesis_after == 6


async def test_progress_caps_restarts_by_a_changing_world() -> None:
    """Two side effects whose results tick like a clock keep moving the world; each key
    restarts at most WORLD_RESET_CAP times, so the loop still ends in synthesis."""
    turns = []
    for n in range(WORLD_RESET_CAP + 10):
        turns.append(("bash", "make", f"built at {n}", RUN))
        turns.append(("bash", "cat log", f"log {n}", RUN))
    out = await replay(calls(*turns), policy="progress")
    assert out.synthesis_after is not None
    assert out.synthesis_after < 2 * (WORLD_RESET_CAP + 3 + 5)


async def test_adr_counts_every_identical_call() -> None:
    turns = [("bash", "python reproduce.py", f"out {n}", RUN) for n in range(6)]
    out = await replay(calls(*turns), policy="adr")
    assert out.synthesis_after == 3 and out.hard_limit_at == 4


async def test_synthesis_at_t_minus_1_and_the_hard_limit_are_the_same_under_both_policies() -> None:
    turns = [("grep", "x", "same", READ)] * 9
    for policy in ("adr", "progress"):
        for threshold in (3, 5, 8):
            out = await replay(calls(*turns), policy=policy, threshold=threshold)  # type: ignore[arg-type]
            assert out.synthesis_after == threshold - 2
            assert out.hard_limit_at == threshold - 1


def _write_repo(tmp_path: Path) -> Path:
    (tmp_path / "notes.md").write_text("first\n")
    return tmp_path


@pytest.mark.parametrize(
    ("policy", "synthesized"), [("progress", None), ("adr", "repeated_tool")]
)
async def test_live_edit_then_reread_is_not_a_loop_under_progress(
    tmp_path: Path, policy: str, synthesized: str | None
) -> None:
    """A real write followed by a real read of the same file, six times: under `progress` each
    read follows a write whose result was new, so its counter restarts (an event says why);
    the ADR's counting gives a synthesis turn after the fourth read."""
    repo = _write_repo(tmp_path)
    turns = []
    for n in range(6):
        turns.append(call("write_file", path="notes.md", content=f"version {n}\n"))
        turns.append(call("read_file", path="notes.md"))
    script = {"turns": [*turns, {"text": "Done."}], "on_synthesis": {"text": "Stopped."}}
    agent = keel.Agent(
        keel.ScriptedTransport.from_dict(script),
        tools=[*keel.file_tools(repo), *keel.write_tools(repo)],
        approve_tools=["write_file"],
        limits=keel.Limits(loop_policy=policy),  # type: ignore[arg-type]
        store=keel.Store(":memory:"),
    )
    result = await agent.arun("Keep the notes current.")
    assert result.status == "completed" and result.synthesized == synthesized
    events = agent.store.events(result.run_id)
    reasons = {e.reason for e in events if isinstance(e, EvidenceReset)}
    assert ("world_changed" in reasons) is (policy == "progress")


async def test_the_policy_is_recorded_with_the_run_and_used_on_resume(tmp_path: Path) -> None:
    store = keel.Store(tmp_path / "runs.sqlite")
    script = {"turns": [call("read_file", path="notes.md"), {"text": "ok"}]}
    repo = _write_repo(tmp_path)
    out = await run_script(script, keel.file_tools(repo), store=store, loop_policy="adr")
    record = store.get_run(out.result.run_id)
    assert record is not None and record.config.limits.loop_policy == "adr"
    shown = CliRunner().invoke(
        app, ["show", out.result.run_id, "--json", "--store", str(tmp_path / "runs.sqlite")]
    )
    assert json.loads(shown.stdout)["loop_rules"]["policy"] == "adr"
    text = CliRunner().invoke(
        app, ["show", out.result.run_id, "--store", str(tmp_path / "runs.sqlite")]
    )
    assert "loop rules: policy adr, threshold 5" in text.stdout


async def test_the_world_version_is_checkpointed_and_restored_on_resume(tmp_path: Path) -> None:
    """A write that paused for approval, then a resume in a fresh agent: the counters and the
    world version come back from the store, so the read after the write still restarts."""
    repo = _write_repo(tmp_path)
    db = tmp_path / "runs.sqlite"
    script = {
        "turns": [
            call("read_file", path="notes.md"),
            call("write_file", path="notes.md", content="second\n"),
            call("read_file", path="notes.md"),
            {"text": "Done."},
        ]
    }

    def agent() -> keel.Agent:
        return keel.Agent(
            keel.ScriptedTransport.from_dict(script),
            tools=[*keel.file_tools(repo), *keel.write_tools(repo)],
            store=keel.Store(db),
        )

    first = agent()
    paused = await first.arun("Update the notes.")
    assert paused.status == "awaiting_approval"
    first.approve(paused.run_id, paused.pending_approvals[0].call_id, by="ana")
    resumed = await agent().aresume(paused.run_id)
    assert resumed.status == "completed"
    store = keel.Store(db)
    record = store.get_run(paused.run_id)
    assert record is not None and record.state.world == 1
    events = store.events(paused.run_id)
    assert [e.reason for e in events if isinstance(e, EvidenceReset)] == ["world_changed"]


def test_a_run_saved_before_loop_policies_existed_resumes_under_adr() -> None:
    config = RunConfig.decode(
        {"model": "script:x", "system_prompt": "", "limits": {"loop_threshold": 5}}
    )
    assert config.limits.loop_policy == "adr"
    assert keel.Limits().loop_policy == "progress"


def test_an_unknown_loop_policy_is_a_configuration_error() -> None:
    with pytest.raises(keel.ConfigError, match="loop policy must be one of progress, adr"):
        keel.Limits(loop_policy="lenient")  # type: ignore[arg-type]


def test_a_mistyped_loop_policy_names_the_closest_policy() -> None:
    with pytest.raises(keel.ConfigError, match=r"did you mean 'progress'\?"):
        keel.Limits(loop_policy="prog")  # type: ignore[arg-type]
    with pytest.raises(keel.ConfigError, match=r"--loop-policy: .*did you mean 'progress'\?"):
        resolve_one("loop_policy", "prog")
