"""How `keel show` presents a run: the JSON contract and a readable timeline."""

from __future__ import annotations

from typing import Any

from rich.markup import escape
from rich.table import Table

from keel.records import (
    ApprovalDecided,
    ApprovalRequested,
    Event,
    EvidenceReset,
    ModelErrorSeen,
    ModelRequestSent,
    ModelResponseReceived,
    ResultElided,
    RunCompleted,
    RunFailed,
    RunResumed,
    RunStarted,
    ToolCallRequested,
    ToolDispatched,
    ToolResultRecorded,
    UnknownEvent,
    encode_event,
)
from keel.store import RunRecord
from keel.terminal import describe_call, safe_text

__all__ = ["event_json", "run_json", "timeline"]


def run_json(record: RunRecord) -> dict[str, Any]:
    """The run's fields, the same as `keel run --json` prints."""
    return record.state.result(record.run_id).to_dict()


def event_json(event: Event) -> dict[str, Any]:
    """One event as `keel show --json` prints it: seq, type, at and the event's fields."""
    type_, data, body = encode_event(event)
    shown: dict[str, Any] = {"seq": event.seq, "type": type_, "at": event.at, **data}
    if isinstance(event, ToolResultRecorded):
        shown["content"] = body
        shown["elided"] = event.elided
    return shown


def timeline(events: list[Event]) -> Table:
    table = Table("step", "event", "detail", box=None, pad_edge=False, show_edge=False)
    for event in events:
        table.add_row(str(event.step), _label(event), escape(safe_text(_detail(event))))
    return table


def _label(event: Event) -> str:
    match event:
        case ModelRequestSent(synthesis=str()):
            return "[bold yellow]synthesis turn[/]"
        case ToolResultRecorded(uncertain=True):
            return "[bold red]effect unknown[/]"
        case RunFailed():
            return "[bold red]failed[/]"
        case RunCompleted():
            return "[bold green]completed[/]"
        case ApprovalRequested():
            return "[bold]approval asked[/]"
        case ApprovalDecided():
            return "[bold]decision[/]"
        case UnknownEvent():
            return escape(safe_text(event.type_name.replace("_", " ")))
    return event.type.replace("_", " ")


def _size(chars: int) -> str:
    return f"{chars / 1000:.1f} KB" if chars >= 1000 else f"{chars} chars"


def _detail(event: Event) -> str:
    match event:
        case RunStarted() | RunResumed():
            return f"model {event.model}"
        case ModelRequestSent():
            how = f"tool_choice={event.tool_choice}" if event.tool_choice else "tools allowed"
            return f"attempt {event.attempt} · {how} · ~{event.estimated_input_tokens} tokens in"
        case ModelResponseReceived():
            calls = ", ".join(c.name for c in event.tool_calls)
            tokens = f"{event.usage.input_tokens}+{event.usage.output_tokens} tokens"
            if calls:
                return f"asks for {calls} · {tokens}"
            return "(empty turn)" if event.empty else f"answers · {tokens}"
        case ModelErrorSeen():
            retry = f" · retry in {event.retry_in:.1f}s" if event.retry_in else ""
            return f"{event.status or ''} {event.message}{retry}"[:140]
        case ToolCallRequested() | ToolDispatched():
            return event.call_key[:110]
        case ToolResultRecorded():
            flags = [f for f in ("is_error", "truncated", "elided") if getattr(event, f)]
            return f"{event.name} · {_size(event.size)} {' '.join(flags)}".rstrip()
        case ResultElided():
            return f"{_size(event.size)} of {event.call_key[:80]} → pointer"
        case EvidenceReset():
            return f"page changed: {event.call_key[:80]} (reset {event.resets})"
        case ApprovalRequested():
            return f"{event.call_id} · " + "\n".join(describe_call(event.name, event.arguments))
        case ApprovalDecided():
            verdict = "approved" if event.approved else "denied"
            reason = f": {event.reason}" if event.reason else ""
            return f"{event.call_id} {verdict} by {event.by}{reason}"
        case RunCompleted():
            how = f" (synthesized: {event.synthesized})" if event.synthesized else ""
            cut = " · cut off at the output limit" if event.cut_off else ""
            return f"answer{how}{cut}"
        case RunFailed():
            return f"{event.kind}: {event.message}"
    return ""
