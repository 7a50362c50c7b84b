"""Two gaps in the context builder found by the long-runs benchmark (benchmarks/long_runs.py,
issue 44), each a rule of ADR 0060 now kept: a context synthesis turn compacts every pointer,
so only the question and the run's own turns passing the window end a run ContextExhausted;
and fitting never replaces a result with a longer pointer. Both failed before the fix (they
were strict xfail tests). Scripted, as tests/test_long_runs.py."""

from __future__ import annotations

from typing import Any

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


async def test_fitting_never_replaces_a_result_by_a_longer_pointer() -> None:
    turns = [call("note", n=n) for n in range(1, 4)]
    turns += [{"tool_calls": [{"name": "fetch_page", "arguments": {"n": n}} for n in range(1, 7)]}]
    out = await run_script(
        {"turns": [*turns, {"text": "done"}], **SCRIPT_END}, tools(), context_window=2048
    )
    sizes = {e.call_id: e.size for e in out.of_type(ToolResultRecorded)}
    pointer = 150  # "[elided to save context: the result of note {...} (10 characters, ..."
    assert [e.call_key for e in out.of_type(ResultElided) if sizes[e.call_id] < pointer] == []
