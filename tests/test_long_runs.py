"""Long runs (issue 44): the context window is a limit that ends in an answer, and nothing
elided is lost. Each test is named after the rule it checks (docs/adr/0060-long-runs.md)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

import keel
from keel.cli.app import app
from keel.records import (
    ContextShrunk,
    ModelErrorSeen,
    ModelRequestSent,
    ResultClamped,
    ResultElided,
    ToolCallRequested,
    ToolResultRecorded,
)
from support import Outcome, call, run_script

PAGE = "The lease is renewed every ten seconds. " + "Filler sentence about nothing. " * 400


def pages() -> list[keel.Tool]:
    @keel.tool
    def fetch_page(n: int) -> str:
        """Fetch page n of the report."""
        return f"page {n}: " + PAGE + f" (planted fact {n}: code {1000 + n})"

    return [fetch_page]


def limit_of(out: Outcome) -> int:
    window = out.store.get_run(out.result.run_id).config.settings["window"]  # type: ignore[union-attr]
    assert isinstance(window, dict)
    return int(window["tokens"]) - int(window["answer"]) - 700


def sizes(out: Outcome) -> list[int]:
    return [e.estimated_input_tokens for e in out.of_type(ModelRequestSent)]


def shown(out: Outcome) -> str:
    return "\n".join(str(i) for r in out.requests for i in r.items)


async def run(turns: list[dict[str, Any]], **limits: Any) -> Outcome:
    script = {"turns": turns, "on_synthesis": {"text": "From what fits: code 1001."}}
    return await run_script(script, pages(), **limits)


async def test_every_request_is_fitted_to_the_models_window_before_it_is_sent() -> None:
    turns = [call("fetch_page", n=n) for n in range(1, 9)] + [{"text": "code 1001 [r1]"}]
    out = await run(turns, context_window=4096, max_model_calls=20)
    assert out.result.status == "completed" and out.result.answer == "code 1001 [r1]"
    assert max(sizes(out)) <= limit_of(out)
    assert out.of_type(ResultElided)  # the older pages gave way


async def test_an_oversized_batch_is_clamped_with_a_pointer_naming_read_result() -> None:
    batch = {"tool_calls": [{"name": "fetch_page", "arguments": {"n": n}} for n in range(1, 5)]}
    out = await run([batch, {"text": "done"}], context_window=2048, max_result_chars=20_000)
    clamps = out.of_type(ResultClamped)
    assert clamps and all(c.shown < c.size for c in clamps)
    assert max(sizes(out)) <= limit_of(out)
    last = out.requests[-1]
    texts = [i.content for i in last.items if isinstance(i, keel.ToolResult)]
    assert any(
        "[clamped to fit the model's window" in t and 'read_result(id="r' in t for t in texts
    )
    assert "read_result" in {t.name for t in last.tools}


async def test_when_even_the_fitted_request_is_too_long_the_turn_is_a_context_synthesis_turn() -> (
    None
):
    batch = {"tool_calls": [{"name": "fetch_page", "arguments": {"n": n}} for n in range(50)]}
    out = await run([batch], context_window=4096)
    assert out.result.status == "completed", out.result.failure
    assert out.result.synthesized == "context"
    synthesis = [e for e in out.of_type(ModelRequestSent) if e.synthesis]
    assert synthesis and synthesis[-1].synthesis == "context"
    assert max(sizes(out)) <= limit_of(out)


async def test_a_question_longer_than_the_window_ends_context_exhausted_not_a_refused_request() -> (
    None
):
    script = {"turns": [{"text": "never sent"}]}
    out = await run_script(script, pages(), question="why " * 4000, context_window=1024)
    assert out.result.status == "failed"
    assert out.result.failure is not None and out.result.failure.kind == "ContextExhausted"
    assert out.requests == []  # nothing the provider would have refused was sent


OVERFLOW = {"error": {"status": 400, "message": "prompt is too long: 9000 tokens > 8192 maximum"}}


async def test_a_context_length_refusal_gets_one_shrink_and_retry_recorded_as_an_event() -> None:
    turns = [call("fetch_page", n=1), call("fetch_page", n=2), OVERFLOW, {"text": "code 1002"}]
    out = await run(turns)
    assert out.result.status == "completed" and out.result.answer == "code 1002"
    (shrunk,) = out.of_type(ContextShrunk)
    assert shrunk.window == 8192 and shrunk.limit < shrunk.sent
    assert out.requests[-1].estimated_input_tokens <= shrunk.limit
    assert [e.retry_in for e in out.of_type(ModelErrorSeen)] == [0.0]


async def test_a_second_refusal_ends_with_a_context_synthesis_turn_and_a_third_is_classified() -> (
    None
):
    turns = [call("fetch_page", n=1), OVERFLOW, OVERFLOW]
    out = await run(turns)
    assert out.result.status == "completed" and out.result.synthesized == "context"
    assert len(out.of_type(ContextShrunk)) == 2
    script = {"turns": [call("fetch_page", n=1), OVERFLOW, OVERFLOW, OVERFLOW]}
    failed = await run_script(script, pages())
    assert failed.result.status == "failed" and failed.result.failure is not None
    assert failed.result.failure.kind == "ContextExhausted"  # never ModelError
    assert failed.result.failure.details["window"] == 8192


# -- reading back what was elided ------------------------------------------------------------


def read_back(ref: str, **more: Any) -> dict[str, Any]:
    return call("read_result", id=ref, **more)


async def test_read_result_is_offered_only_once_a_result_was_elided_or_cut() -> None:
    out = await run([call("fetch_page", n=1), {"text": "code 1001"}])
    assert all("read_result" not in {t.name for t in r.tools} for r in out.requests)
    cut = await run([call("fetch_page", n=1), {"text": "code 1001"}], max_result_chars=2000)
    assert "read_result" in {t.name for t in cut.requests[-1].tools}
    assert 'read_result(id="r1", offset=2000)' in shown(cut)


async def test_an_elided_result_is_read_back_whole_without_calling_its_tool_again() -> None:
    turns = [call("fetch_page", n=n) for n in range(1, 6)]
    turns += [read_back("r1", pattern="planted fact"), {"text": "code 1001 [r6]"}]
    out = await run(turns, context_window=8192)
    elided = {e.call_id for e in out.of_type(ResultElided)}
    first = out.of_type(ToolResultRecorded)[0]
    assert first.call_id in elided
    assert 'read_result(id="r1")' in shown(out)  # the pointer names the call
    back = out.of_type(ToolResultRecorded)[-1]
    assert back.name == "read_result" and not back.is_error
    assert "planted fact 1: code 1001" in back.content
    assert [e.name for e in out.of_type(ToolCallRequested)].count("fetch_page") == 5


async def test_read_result_pages_a_truncated_result_from_the_whole_text_and_finds_a_pattern() -> (
    None
):
    turns = [
        call("fetch_page", n=7),
        read_back("r1", offset=2000, length=500),
        read_back("r1", pattern="planted fact"),
        {"text": "code 1007"},
    ]
    out = await run(turns, max_result_chars=2000)
    page, found = [e.content for e in out.of_type(ToolResultRecorded)][1:]
    assert page.startswith("[r1: characters 2000-2500 of ") and "offset=2500" in page
    assert "planted fact 7: code 1007" in found  # past the cut: read from the record


async def test_reading_back_does_not_count_toward_the_repeats_of_the_call_that_produced_it() -> (
    None
):
    turns = [call("fetch_page", n=1)] + [read_back("r1", offset=k * 10) for k in range(6)]
    turns += [{"text": "code 1001"}]
    out = await run(turns, loop_threshold=3, max_result_chars=2000)
    assert out.result.status == "completed" and out.result.synthesized is None
    assert out.result.answer == "code 1001"


async def test_fetching_an_elided_result_again_with_its_tool_still_counts() -> None:
    turns = [call("fetch_page", n=1)] * 3 + [{"text": "never"}]
    out = await run(turns, loop_threshold=3)
    assert out.result.synthesized == "repeated_tool"


async def test_read_result_of_an_unknown_id_is_an_error_the_model_reads() -> None:
    out = await run(
        [call("fetch_page", n=1), read_back("r9"), {"text": "ok"}], max_result_chars=2000
    )
    back = out.of_type(ToolResultRecorded)[-1]
    assert back.is_error and "no result 'r9'" in back.content


async def test_read_back_off_offers_no_tool_and_pointers_name_no_call() -> None:
    turns = [call("fetch_page", n=n) for n in range(1, 6)] + [{"text": "code"}]
    out = await run(turns, context_window=8192, read_back=False)
    assert out.of_type(ResultElided)
    assert "read_result" not in shown(out)
    assert all("read_result" not in {t.name for t in r.tools} for r in out.requests)


def test_keel_show_prints_the_window_and_what_was_elided_with_the_call_that_reads_it_back(
    tmp_path: Path,
) -> None:
    turns = [call("fetch_page", n=n) for n in range(1, 6)] + [{"text": "code 1001"}]
    store = keel.Store(tmp_path / "runs.db")
    out = asyncio.run(run_script({"turns": turns}, pages(), store=store, context_window=8192))
    store.close()
    shown = CliRunner().invoke(
        app, ["show", out.result.run_id, "--store", str(tmp_path / "runs.db")]
    )
    assert shown.exit_code == 0, shown.output
    text = " ".join(shown.output.split())
    assert "window: 8,192 tokens (2,048 for the answer) · context budget 5,444" in text
    assert 'fetch_page {"n":1} (12,476 chars) → read_result(id="r1")' in text
    assert "read back: 0 call(s)" in text
