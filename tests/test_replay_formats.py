"""`keel replay` reads runs other runtimes recorded (issue 38, item 3): OpenTelemetry GenAI
and OpenAI Agents SDK traces, Claude Code sessions, OpenHands event logs. Each hand-written
fixture in `tests/fixtures/replay/` replays to the same synthesis point as the same run
written in the shared trajectories format beside it; bad input is reported, never raised."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from keel.cli.app import app
from keel.replay.lines import Bounds
from keel.replay.playback import replay
from keel.replay.recordings import Recording, Skipped, read_file

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "replay"

SAME_RUNS = [
    # (fixture, the same run in the shared format, synthesis after turn, what brought it)
    ("openai-agents-trace.json", "otel.trajectories.jsonl", 6, "same_result"),
    ("otel-genai-spans.jsonl", "otel.trajectories.jsonl", 6, "same_result"),
    ("claude-code-session.jsonl", "claude-code.trajectories.jsonl", 6, "alternation"),
    ("openhands-trajectory.json", "openhands.trajectories.jsonl", 5, "same_result"),
    ("openhands-output.jsonl", "openhands.trajectories.jsonl", 5, "same_result"),
    ("openhands-sdk-events.json", "openhands.trajectories.jsonl", 5, "same_result"),
]


def _one(name: str) -> Recording:
    skipped: list[Skipped] = []
    recordings = list(read_file(FIXTURES / name, skipped))
    assert skipped == []
    (recording,) = recordings
    return recording


@pytest.mark.parametrize(("fixture", "shared", "after", "tier"), SAME_RUNS)
async def test_each_reader_replays_its_fixture_to_the_synthesis_point_of_the_shared_format(
    fixture: str, shared: str, after: int, tier: str
) -> None:
    theirs, ours = _one(fixture), _one(shared)
    assert len(theirs.turns) == len(ours.turns)
    assert [len(turn) for turn in theirs.turns] == [len(turn) for turn in ours.turns]
    both = ("same_result", "alternation")  # same_result is on by name only (ADR 0064)
    mine, twin = await replay(theirs, tiers=both), await replay(ours, tiers=both)
    assert (mine.synthesis_after, mine.tier) == (twin.synthesis_after, twin.tier) == (after, tier)
    assert mine.key == twin.key
    assert mine.hard_limit_at == twin.hard_limit_at
    assert mine.loops == twin.loops
    alone = await replay(theirs, tiers=())  # the identical counter alone sees no loop here
    assert alone.synthesis_after is None


def test_keel_replay_tells_the_formats_apart_by_their_content() -> None:
    for fixture, _, after, tier in SAME_RUNS:
        out = CliRunner().invoke(
            app, ["replay", str(FIXTURES / fixture), "--json", "--tiers", "same_result,alternation"]
        )
        assert out.exit_code == 0, out.stderr
        assert out.stderr == ""
        (found,) = [json.loads(line) for line in out.stdout.splitlines()]
        assert (found["synthesis_after"], found["tier"]) == (after, tier), fixture


def test_keel_replay_takes_the_format_by_name_and_says_when_a_file_is_not_in_it() -> None:
    session = str(FIXTURES / "claude-code-session.jsonl")
    named = CliRunner().invoke(app, ["replay", session, "--format", "claude-code", "--json"])
    assert named.exit_code == 0 and json.loads(named.stdout)["synthesis_after"] == 6
    wrong = CliRunner().invoke(app, ["replay", session, "--format", "otel", "--json"])
    assert wrong.exit_code == 0 and wrong.stdout == ""
    assert "no tool or model spans in it" in wrong.stderr
    bad = CliRunner().invoke(app, ["replay", session, "--format", "langsmith"])
    assert bad.exit_code == 2 and "--format must be one of auto, trajectories" in bad.stderr


def test_the_readers_keep_one_model_response_s_calls_in_one_turn() -> None:
    """Claude Code writes a line per block of one message id; OpenHands' actions share their
    model response; trace spans after one model span are its turn; sidechains are left out."""
    claude = _one("claude-code-session.jsonl")
    assert [c.tool for c in claude.turns[0]] == ["Glob", "Grep"]
    assert all(c.kind == "read" for c in claude.turns[0])
    assert "README.md" not in json.dumps([c.arguments for t in claude.turns for c in t])
    (edit,) = claude.turns[-1]
    assert (edit.tool, edit.kind, edit.error) == ("Edit", "write", True)
    openhands = _one("openhands-trajectory.json")
    (view,) = openhands.turns[0]
    assert view.error and view.kind == "read"
    assert view.arguments == {"command": "view", "path": "/workspace/repo/src/parser.py"}
    assert [c.arguments["command"][:4] for c in openhands.turns[1]] == ["find", "ls /"]
    (finish,) = openhands.turns[-1]
    assert (finish.tool, finish.result, finish.kind) == ("finish", None, "submit")
    assert _one("openhands-output.jsonl").id == "jsonlib__parser-211"
    sdk = _one("openhands-sdk-events.json")  # the OpenHands SDK's events: `kind`, `tool_call`
    assert [[c.kind for c in turn] for turn in sdk.turns[:2]] == [["read"], ["run", "run"]]
    assert sdk.turns[0][0].error and sdk.turns[0][0].arguments == view.arguments
    trace = _one("openai-agents-trace.json")
    assert [len(turn) for turn in trace.turns] == [1, 1, 2, 1, 1, 1, 1, 1, 1]
    assert _one("otel-genai-spans.jsonl").model == "gpt-4.1-mini"


def test_claude_code_lines_that_cannot_be_read_are_reported_and_skipped(tmp_path: Path) -> None:
    good = (FIXTURES / "claude-code-session.jsonl").read_text().splitlines()
    nameless = {
        "type": "assistant",
        "sessionId": "s",
        "message": {"id": "m9", "content": [{"type": "tool_use", "id": "t9", "input": {}}]},
    }
    odd_input = {
        "type": "assistant",
        "sessionId": "s",
        "message": {"id": "m8", "content": [{"type": "tool_use", "name": "Read", "input": 7}]},
    }
    lines = [*good[:3], "{not json", json.dumps(nameless), json.dumps(odd_input), "[1, 2]"]
    lines.append("[" * 200 + "]" * 200)
    path = tmp_path / "session.jsonl"
    path.write_text("\n".join([*lines, *good[3:]]) + "\n")
    skipped: list[Skipped] = []
    recordings = list(read_file(path, skipped, Bounds(depth=50)))
    reasons = {s.where.rsplit(":", 1)[1]: s.reason for s in skipped}
    assert reasons["4"].startswith("not JSON")
    assert "without a tool name" in reasons["5"]
    assert "is not an object" in reasons["6"]
    assert "not a Claude Code session line" in reasons["7"]
    assert "nested deeper than 50 levels" in reasons["8"]
    session = next(r for r in recordings if r.id != "s")
    assert len(session.turns) == len(_one("claude-code-session.jsonl").turns)


def test_trace_spans_that_cannot_be_read_are_reported_and_skipped(tmp_path: Path) -> None:
    spans = [
        {
            "traceId": "t1",
            "spanId": "1",
            "name": "execute_tool",
            "attributes": {"gen_ai.operation.name": "execute_tool"},
        },
        {"traceId": "t1", "spanId": "2", "attributes": "not a list"},
        {
            "traceId": "t1",
            "spanId": "3",
            "startTimeUnixNano": "not a number",
            "attributes": [
                {"key": "gen_ai.tool.name", "value": {"stringValue": "lookup"}},
                {"key": "gen_ai.tool.call.arguments", "value": {"stringValue": "{not json"}},
                {"key": "error.type", "value": {"stringValue": "TimeoutError"}},
            ],
        },
        "a string",
    ]
    path = tmp_path / "spans.json"
    path.write_text(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}, 7]}))
    skipped: list[Skipped] = []
    (recording,) = read_file(path, skipped)
    assert [s.reason for s in skipped] == ["an execute_tool span without a tool name"]
    ((call,),) = recording.turns
    assert (call.tool, call.arguments, call.result, call.error) == (
        "lookup",
        "{not json",
        None,
        True,
    )


def test_openhands_events_that_cannot_be_read_are_skipped_and_old_pairs_are_read(
    tmp_path: Path,
) -> None:
    run = {"action": "run", "source": "agent", "args": {"command": "ls", "thought": "look"}}
    odd = {
        "id": 5,
        "action": "run",
        "source": "agent",
        "tool_call_metadata": {
            "function_name": "execute_bash",
            "tool_call_id": "c1",
            "model_response": {
                "choices": [
                    {"message": {"tool_calls": [{"id": "c1", "function": {"arguments": 3}}]}}
                ]
            },
        },
    }
    pairs = [
        [{"id": 1, **run}, {"observation": "run", "cause": 1, "content": "a\nb"}],
        [{"id": 2, "action": "message", "source": "agent", "args": {}}, {}],
        [odd, {"observation": "error", "cause": 5, "content": "boom"}],
        "junk",
    ]
    path = tmp_path / "output.jsonl"
    path.write_text(json.dumps({"instance_id": "x-1", "history": pairs}) + "\n")
    skipped: list[Skipped] = []
    (recording,) = read_file(path, skipped)
    assert [s.reason for s in skipped] == [
        "event 5: the arguments of 'execute_bash' are not an object"
    ]
    ((call,),) = recording.turns
    assert (call.tool, call.arguments, call.kind) == ("run", {"command": "ls"}, "run")
    assert call.result is not None and not call.error


ODD_VALUES: list[Any] = [None, 0, -1, 10**400, "", "x", [], {}, [None], {"": None}, True, 1.5]


def _mutations(value: Any, rng: random.Random, rate: float) -> Any:
    """`value` with some of its parts replaced by values of the wrong type."""
    if rng.random() < rate:
        return rng.choice(ODD_VALUES)
    if isinstance(value, dict):
        return {k: _mutations(v, rng, rate) for k, v in value.items()}
    if isinstance(value, list):
        return [_mutations(v, rng, rate) for v in value]
    return value


@pytest.mark.parametrize("fixture", [f for f, _, _, _ in SAME_RUNS])
async def test_no_reader_raises_on_values_of_the_wrong_type(tmp_path: Path, fixture: str) -> None:
    """Each fixture with parts swapped for values of other types, 40 ways: every reader
    reports or passes over what it cannot use, and what it reads replays."""
    source = FIXTURES / fixture
    rng = random.Random(fixture)
    text = source.read_text()
    documents = (
        [json.loads(text)]
        if source.suffix == ".json"
        else [json.loads(line) for line in text.splitlines()]
    )
    for n in range(40):
        bent = [_mutations(d, rng, rate=0.03 + n / 400) for d in documents]
        path = tmp_path / f"{n}{source.suffix}"
        if source.suffix == ".json":
            path.write_text(json.dumps(bent[0]))
        else:
            path.write_text("\n".join(json.dumps(d) for d in bent) + "\n")
        skipped: list[Skipped] = []
        for recording in read_file(path, skipped):
            await replay(recording)
