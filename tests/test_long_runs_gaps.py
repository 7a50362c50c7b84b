"""Gaps in the run side found by the long-runs benchmark (benchmarks/long_runs.py, issue 44).

Each test states what ADR 0060 promises and fails today; it is marked xfail, strict, with the
reason, until the context builder (keel/_run/context.py, not changed by the benchmark's work)
keeps the promise. Scripted, as tests/test_long_runs.py."""

from __future__ import annotations

from typing import Any

import pytest

import keel
from keel.records import ResultElided, ToolResultRecorded
from support import call, run_script

PAGE = "Filler sentence about nothing. " * 400


def tools() -> list[keel.Tool]:
    @keel.tool
    def fetch_page(n: int) -> str:
        """Fetch page n of the report."""
        return f"page {n}: " + PAGE

    @keel.tool
    def note(n: int) -> str:
        """A short note."""
        return f"note {n}: ok"

    return [fetch_page, note]


SCRIPT_END = {"on_synthesis": {"text": "From what fits: nothing more to add."}}


@pytest.mark.xfail(
    strict=True,
    reason="keel/_run/context.py: a context synthesis turn compacts only the latest batch's "
    "pointers; every older elided result keeps its full pointer (its call key, size and "
    "digest, ~65 tokens), so after ~40 steps in a 4k window the pointers alone pass the limit "
    "and the run fails ContextExhausted, though the question and the run's own turns fit "
    "(ADR 0060, step 5: only those alone passing the window end the run so)",
)
async def test_a_long_run_in_a_small_window_ends_with_an_answer_not_context_exhausted() -> None:
    turns: list[dict[str, Any]] = [call("fetch_page", n=n) for n in range(1, 46)]
    out = await run_script(
        {"turns": [*turns, {"text": "done"}], **SCRIPT_END},
        tools(),
        context_window=4096,
        max_model_calls=60,
    )
    assert out.result.failure is None, out.result.failure
    assert out.result.status == "completed"


@pytest.mark.xfail(
    strict=True,
    reason="keel/_run/context.py: fitting to the window (ContextBuilder._fit) elides every "
    "result before the latest batch whatever its size, also a result shorter than the pointer "
    "that replaces it, which makes the request longer, not shorter (after a refusal: the "
    "read-back results themselves, so the answer turn no longer has the facts it read back)",
)
async def test_fitting_never_replaces_a_result_by_a_longer_pointer() -> None:
    turns = [call("note", n=n) for n in range(1, 4)]
    turns += [{"tool_calls": [{"name": "fetch_page", "arguments": {"n": n}} for n in range(1, 7)]}]
    out = await run_script(
        {"turns": [*turns, {"text": "done"}], **SCRIPT_END}, tools(), context_window=2048
    )
    sizes = {e.call_id: e.size for e in out.of_type(ToolResultRecorded)}
    pointer = 150  # "[elided to save context: the result of note {...} (10 characters, ..."
    assert [e.call_key for e in out.of_type(ResultElided) if sizes[e.call_id] < pointer] == []
