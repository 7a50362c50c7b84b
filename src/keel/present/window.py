"""What the model's window did to a run, for `keel show` (issue 44): the window and budget the
run kept to, the results it elided or clamped with the call that reads each back, and the
provider's refusals it sent again smaller."""

from __future__ import annotations

from keel.records import (
    ContextShrunk,
    Event,
    ResultClamped,
    ResultElided,
    ToolCallRequested,
    ToolResultRecorded,
)
from keel.store import RunRecord

__all__ = ["window_lines"]

_LISTED = 12
"""Elided results listed by name; the rest are counted."""


def window_lines(record: RunRecord, events: list[Event]) -> list[str]:
    lines = []
    window = record.config.settings.get("window")
    if isinstance(window, dict):
        tokens, answer, budget = window.get("tokens"), window.get("answer"), window.get("budget")
        if all(isinstance(v, int) for v in (tokens, answer, budget)):
            lines.append(
                f"window: {tokens:,} tokens ({answer:,} for the answer) · context budget "
                f"{budget:,}"
            )
    refs = _refs(events) if record.config.continues_from is None else {}
    elided = [e for e in events if isinstance(e, ResultElided)]
    clamped = [e for e in events if isinstance(e, ResultClamped)]
    if elided:
        named = [_named(e.call_id, e.call_key, e.size, refs) for e in elided[:_LISTED]]
        more = f" and {len(elided) - _LISTED} more" if len(elided) > _LISTED else ""
        lines.append(f"elided ({len(elided)}): " + "; ".join(named) + more)
    if clamped:
        named = [_named(e.call_id, e.call_key, e.size, refs) for e in clamped[:_LISTED]]
        lines.append(f"clamped to fit the window ({len(clamped)}): " + "; ".join(named))
    if elided or clamped:
        reads = sum(isinstance(e, ToolCallRequested) and e.name == "read_result" for e in events)
        how = "read_result(id=...) reads any of them back from the record"
        lines.append(f"read back: {reads} call(s) · {how}")
    shrunk = [e for e in events if isinstance(e, ContextShrunk)]
    for event in shrunk:
        said = f" (its window: {event.window:,})" if event.window else ""
        lines.append(
            f"refused as too long at step {event.step}, ~{event.sent:,} tokens{said}; sent again "
            f"within ~{event.limit:,}"
        )
    return lines


def _refs(events: list[Event]) -> dict[str, str]:
    """Each result's citable id as the run's context numbered them: results enter the history
    in the order their calls were asked for (a batch answered out of order included)."""
    answered = {e.call_id for e in events if isinstance(e, ToolResultRecorded)}
    refs: dict[str, str] = {}
    for event in events:
        if isinstance(event, ToolCallRequested) and event.call_id in answered:
            refs.setdefault(event.call_id, f"r{len(refs) + 1}")
    return refs


def _named(call_id: str, call_key: str, size: int, refs: dict[str, str]) -> str:
    key = call_key if len(call_key) <= 60 else call_key[:59] + "…"
    ref = refs.get(call_id)
    back = f' → read_result(id="{ref}")' if ref else ""
    return f"{key} ({size:,} chars){back}"
