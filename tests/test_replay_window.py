"""`keel replay --window`: where a recorded run's requests would have passed a context window,
with nothing elided and through Keel's context builder (keel/replay/window.py, ADR 0059)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import keel
from keel.agent import WINDOW_MARGIN
from keel.cli.app import app
from keel.messages import ToolCall
from keel.records import ToolResultRecorded
from keel.replay.recorded import Recorded, Recording
from keel.replay.recordings import read_file
from keel.replay.window import MARGIN, WindowCheck, _result, fit
from keel.windows import window_for
from support import call, run_script

WINDOW_8K = WindowCheck(window_for("", 8192))
"""8,192 tokens, 2,048 for the answer: a request over 6,144 tokens does not fit."""


def _run(run_id: str, sizes: list[int | None], **fields: Any) -> dict[str, Any]:
    turns = [
        [
            {
                "tool": "bash",
                "arguments": {"command": f"cat part{n}"},
                "kind": "read",
                "result_digest": f"{n:016x}",
                "result_chars": size,
            }
        ]
        for n, size in enumerate(sizes)
    ]
    return {"corpus": "mine", "model": "m", "id": run_id, "turns": turns, **fields}


def _recording(tmp_path: Path, *runs: dict[str, Any]) -> Path:
    path = tmp_path / "runs.jsonl"
    path.write_text("".join(json.dumps(run) + "\n" for run in runs))
    return path


def _fits(path: Path, check: WindowCheck = WINDOW_8K) -> dict[str, Any]:
    return {r.id: fit(r, check) for r in read_file(path, [])}


def test_a_run_whose_results_grow_past_the_window_is_reported_at_the_turn_it_passes_it(
    tmp_path: Path,
) -> None:
    """Eight results of 8,000 characters (about 2,200 tokens each): the whole history passes
    6,144 tokens with the third, so the request for turn 3 would not fit; Keel's builder elides
    the old ones past its budget and every request it sends fits."""
    path = _recording(tmp_path, _run("grows", [8000] * 8))
    found = _fits(path)["grows"]
    assert found.over_at == 3
    assert found.requests == 9 and found.largest > 8 * 2200
    assert found.kept_over_at is None and found.newest_batch is None
    assert found.largest_kept <= WINDOW_8K.limit


def test_a_result_larger_than_the_window_is_over_whole_but_fitted_under_keel(
    tmp_path: Path,
) -> None:
    """Results doubling from 1,000 characters: the whole history passes 6,144 tokens with the
    16,000-character result (31,000 characters in all), so the request for turn 5 would not
    fit; Keel's builder cuts each result to a quarter of its budget, elides the old ones and
    clamps a batch too big for the window (ADR 0060), so every request it sends fits."""
    path = _recording(tmp_path, _run("doubles", [1000, 2000, 4000, 8000, 16000, 32000, 500]))
    found = _fits(path)["doubles"]
    assert found.over_at == 5
    assert found.kept_over_at is None and not found.batch_too_big
    assert found.largest_kept <= WINDOW_8K.limit


def test_a_run_that_fits_the_window_is_not_reported(tmp_path: Path) -> None:
    path = _recording(tmp_path, _run("small", [400] * 20))
    found = _fits(path)["small"]
    assert found.over_at is None and found.kept_over_at is None
    assert found.largest == found.largest_kept  # nothing elided or cut: both count alike
    out = CliRunner().invoke(app, ["replay", str(path), "--window", "8192"])
    assert out.exit_code == 0, out.stderr
    assert "window 8,192 tokens, 2,048 for the answer" in out.stdout
    assert "6,144 tokens does not fit" in out.stdout
    window_table = out.stdout[out.stdout.index("window 8,192") :]
    row = next(line for line in window_table.splitlines() if line.startswith("│ mine / m"))
    assert row.count("0 (0%)") == 2


def test_keel_replay_window_json_has_the_fields(tmp_path: Path) -> None:
    path = _recording(tmp_path, _run("grows", [8000] * 8), _run("small", [400] * 3))
    plain = CliRunner().invoke(app, ["replay", str(path), "--json"])
    out = CliRunner().invoke(app, ["replay", str(path), "--json", "--window", "8192"])
    assert out.exit_code == 0, out.stderr
    found = [json.loads(line) for line in out.stdout.splitlines()]
    loops = [json.loads(line) for line in plain.stdout.splitlines()]
    assert all("window" not in run for run in loops)
    assert [{k: v for k, v in run.items() if k != "window"} for run in found] == loops
    grows, small = (run["window"] for run in found)
    assert set(grows) == {
        "context",
        "output",
        "limit",
        "budget",
        "requests",
        "largest",
        "over_at",
        "largest_kept",
        "kept_over_at",
        "newest_batch",
        "newest_batch_too_big",
        "own_turns",
        "unsized_results",
    }
    assert (grows["context"], grows["output"], grows["limit"]) == (8192, 2048, 6144)
    assert grows["budget"] == 6144 - MARGIN
    assert (grows["over_at"], grows["kept_over_at"], grows["requests"]) == (3, None, 9)
    assert (small["over_at"], small["kept_over_at"], small["unsized_results"]) == (None, None, 0)


@pytest.mark.parametrize("value", ["0", "-5", "abc", "2.5", "", "1023"])
def test_bad_window_values_are_one_line_usage_errors(tmp_path: Path, value: str) -> None:
    path = _recording(tmp_path, _run("small", [400]))
    out = CliRunner().invoke(app, ["replay", str(path), f"--window={value}"])
    assert out.exit_code == 2
    assert out.stderr.startswith("keel replay: --window") and out.stderr.count("\n") == 1
    assert out.stdout == ""


def test_a_window_of_a_model_is_its_window_in_keels_table(tmp_path: Path) -> None:
    path = _recording(tmp_path, _run("small", [400]))
    out = CliRunner().invoke(app, ["replay", str(path), "--window-of", "openai:gpt-4o"])
    assert out.exit_code == 0, out.stderr
    assert "window 128,000 tokens, 16,384 for the answer (--window-of openai:gpt-4o:" in out.stdout
    mine = CliRunner().invoke(app, ["replay", str(path), "--window-of", "x:y", "--window", "4096"])
    assert "window 4,096 tokens, 1,024 for the answer (--window-of x:y --window 4096)" in (
        mine.stdout
    )
    empty = CliRunner().invoke(app, ["replay", str(path), "--window-of", " "])
    assert empty.exit_code == 2 and empty.stderr.count("\n") == 1


def test_the_window_check_keeps_the_margin_the_agent_keeps() -> None:
    assert MARGIN == WINDOW_MARGIN


async def test_a_cut_result_is_sized_as_the_executor_shows_it(tmp_path: Path) -> None:
    """A result past `max_result_chars` is shown as its head and a marker; the check's stand-in
    is as long as what a live run stored."""

    @keel.tool
    def dump() -> str:
        """A long listing."""
        return "y" * 60_000

    live = await run_script({"turns": [call("dump"), {"text": "done"}]}, [dump])
    (shown,) = live.of_type(ToolResultRecorded)
    assert shown.truncated and shown.size == 60_000
    recorded = Recorded("dump", {}, shown.digest, chars=60_000)
    stand_in = _result(ToolCall.from_arguments("c", "dump", {}), recorded, 60_000, 50_000)
    assert len(stand_in.content) == len(shown.content)


def test_the_model_s_own_turns_count_with_their_full_arguments() -> None:
    """The shared trajectories shorten a long argument (an edit's text) to its digest and
    length; the check counts the length, and the builder never elides a model's turn, so edits
    alone can pass the window."""
    edit = {"command": "str_replace", "new_str": "sha256:0123456789abcdef:9000"}
    turns = tuple((Recorded("editor", edit, f"{n:016x}", chars=60),) for n in range(4))
    found = fit(Recording("edits", turns), WINDOW_8K)
    assert found.kept_over_at == 3 and found.own_turns is not None
    assert found.own_turns > WINDOW_8K.limit and not found.batch_too_big


def test_a_recorded_size_of_any_magnitude_is_counted_without_holding_it() -> None:
    huge = Recording("huge", ((Recorded("cat", {}, "a" * 16, chars=10**12),),))
    started = time.process_time()
    found = fit(huge, WINDOW_8K)
    assert time.process_time() - started < 2
    assert found.largest > 10**12 / 3.6 and found.over_at == 1
    assert found.kept_over_at is None  # cut where a run in this window cuts it (ADR 0060)
    assert found.largest_kept <= WINDOW_8K.limit


def test_chat_recordings_size_the_question_the_model_s_text_and_each_result(
    tmp_path: Path,
) -> None:
    messages = [
        {"role": "system", "content": "s" * 100},
        {"role": "user", "content": "q" * 50},
        {
            "role": "assistant",
            "content": "t" * 30,
            "tool_calls": [{"id": "c1", "function": {"name": "read", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "r" * 7000},
    ]
    path = tmp_path / "chat.json"
    path.write_text(json.dumps({"messages": messages}))
    (recording,) = read_file(path, [])
    assert recording.question_chars == 150 and recording.texts == (30,)
    assert recording.turns[0][0].chars == 7000


async def test_a_stored_run_is_sized_from_its_question_text_and_results(tmp_path: Path) -> None:
    from keel.replay.recordings import read_store

    @keel.tool
    def page() -> str:
        """A page."""
        return "p" * 1234

    store = keel.Store(tmp_path / "runs.sqlite")
    script = {"turns": [{"text": "reading", **call("page")}, {"text": "done"}]}
    live = await run_script(script, [page], store=store, question="What is on the page?")
    (recording,) = read_store(store, [live.result.run_id])
    assert recording.turns[0][0].chars == 1234 and recording.texts == (7,)
    assert recording.question_chars >= len("What is on the page?")
