"""`keel replay`: recorded runs through the real run loop (docs/adr/0029).

The shared corpora (`../shared/trajectories`, 948 runs other teams recorded) replay under the
ADR's counting to the figures published with them, and under `progress` to the targets."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import keel
from keel.cli.app import app
from keel.replay.playback import replay
from keel.replay.recordings import Skipped, read_file, read_store
from keel.replay.report import rows
from support import call, run_script

TRAJECTORIES = Path(__file__).resolve().parents[2] / "shared" / "trajectories"
CORPORA = sorted(TRAJECTORIES.glob("*.jsonl.gz"))
needs_corpora = pytest.mark.skipif(not CORPORA, reason=f"no recorded corpora in {TRAJECTORIES}")


async def test_replay_of_a_stored_run_gives_the_synthesis_turn_of_the_live_run(
    tmp_path: Path,
) -> None:
    """The replay is the loop, not a copy of it: a live scripted run over real file tools is
    stored, replayed from the store, and the synthesis turn comes after the same turn."""
    (tmp_path / "a.md").write_text("alpha\n")
    (tmp_path / "b.md").write_text("beta\n")
    read_a, read_b = call("read_file", path="a.md"), call("read_file", path="b.md")
    script = {
        "turns": [read_a, read_b, read_a, read_b, read_a, read_a, read_a],
        "on_synthesis": {"text": "best supported answer"},
    }
    store = keel.Store(tmp_path / "runs.sqlite")
    live = await run_script(script, keel.file_tools(tmp_path), store=store)
    assert live.result.synthesized == "repeated_tool"
    modes = [r.tool_choice for r in live.requests]
    live_synthesis_after = modes.index("none") - 1  # the turn before the synthesis request

    (recording,) = read_store(store, [live.result.run_id])
    replayed = await replay(recording)
    assert replayed.synthesis_after == live_synthesis_after == 5
    assert replayed.key == 'read_file {"path":"a.md"}'


@needs_corpora
async def test_the_adr_policy_replays_the_shared_corpora_to_the_published_figures() -> None:
    skipped: list[Skipped] = []
    recordings = [r for path in CORPORA for r in read_file(path, skipped)]
    assert skipped == [] and len(recordings) == 948
    replayed = [await replay(r, policy="adr") for r in recordings]
    by_name = {row.name: row for row in rows(replayed)}
    pooled = by_name["all"]
    assert (pooled.synthesis, pooled.hard_limit) == (484, 398)
    assert (pooled.resolved_cut, pooled.resolved) == (76, 219)
    assert (pooled.loops_caught, pooled.loops) == (26, 26)
    openhands = next(row for name, row in by_name.items() if name.startswith("OpenHands"))
    assert (openhands.runs, openhands.synthesis, openhands.hard_limit) == (500, 390, 320)
    assert openhands.resolved_cut == 75


@needs_corpora
async def test_the_progress_policy_meets_the_targets_on_the_shared_corpora() -> None:
    """Every back-to-back loop reaches its synthesis turn; at most 1% of resolved runs get one
    before their last source write."""
    recordings = [r for path in CORPORA for r in read_file(path, [])]
    replayed = [await replay(r, policy="progress") for r in recordings]
    pooled = rows(replayed)[-1]
    assert (pooled.loops_caught, pooled.loops) == (26, 26)
    assert pooled.resolved_cut <= 0.01 * pooled.resolved


def _trajectory(run_id: str, commands: list[str], results: list[str]) -> str:
    turns = [
        [{"tool": "bash", "arguments": {"command": c}, "kind": "read", "result_digest": d}]
        for c, d in zip(commands, results, strict=True)
    ]
    return json.dumps({"corpus": "mine", "model": "m", "id": run_id, "turns": turns})


def test_keel_replay_reports_malformed_lines_with_their_number_and_skips_them(
    tmp_path: Path,
) -> None:
    path = tmp_path / "runs.jsonl.gz"
    loop = _trajectory("loop", ["ls"] * 6, ["same"] * 6)
    lines = [loop, "{not json", json.dumps({"id": "x"}), _trajectory("ok", ["a", "b"], ["1", "2"])]
    with gzip.open(path, "wt") as handle:
        handle.write("\n".join(lines) + "\n")
    out = CliRunner().invoke(app, ["replay", str(path), "--json"])
    assert out.exit_code == 0, out.stderr
    assert f"skipped {path}:2: not JSON" in out.stderr
    assert f"skipped {path}:3: no `turns` list" in out.stderr
    assert "Traceback" not in out.stderr
    found = [json.loads(line) for line in out.stdout.splitlines()]
    assert [f["id"] for f in found] == ["loop", "ok"]
    assert found[0]["synthesis_after"] == 3 and found[0]["key"] == 'bash {"command":"ls"}'
    assert found[1]["synthesis_after"] is None


def test_keel_replay_prints_the_table_and_takes_the_threshold(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    path.write_text(_trajectory("loop", ["ls"] * 6, ["same"] * 6) + "\n")
    out = CliRunner().invoke(app, ["replay", str(path), "--threshold", "3"])
    assert out.exit_code == 0, out.stderr
    assert "policy progress, T = 3" in out.stdout and "1 (100%)" in out.stdout
    bad = CliRunner().invoke(app, ["replay", str(path), "--loop-policy", "lenient"])
    assert bad.exit_code == 2 and "--loop-policy must be one of progress, adr" in bad.stderr


def test_keel_replay_reads_openai_chat_message_lists(tmp_path: Path) -> None:
    messages = [{"role": "user", "content": "Find the parser."}]
    for n in range(5):
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"c{n}",
                        "type": "function",
                        "function": {"name": "find_file", "arguments": '{"name": "Parser"}'},
                    }
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": f"c{n}", "content": "No matches"})
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"messages": messages}) + "\n")
    out = CliRunner().invoke(app, ["replay", str(path), "--json"])
    assert out.exit_code == 0, out.stderr
    (found,) = [json.loads(line) for line in out.stdout.splitlines()]
    assert found["turns"] == 5 and found["synthesis_after"] == 3


def test_keel_replay_of_a_store_needs_a_store_that_exists(tmp_path: Path) -> None:
    out = CliRunner().invoke(app, ["replay", "--store", str(tmp_path / "none.sqlite")])
    assert out.exit_code == 2 and "no store at" in out.stderr
    out = CliRunner().invoke(app, ["replay"])
    assert out.exit_code == 2 and "give recorded run files, or --store" in out.stderr
