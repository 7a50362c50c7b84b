"""How `keel show` presents a run: the JSON contract and a readable timeline."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from keel.store import RunRecord


def run_json(record: RunRecord) -> dict[str, Any]:
    """The run's fields, the same as `keel run --json` prints."""
    state = record.state
    usage = state.get("usage", [0, 0, 0])
    failure = state.get("failure")
    return {
        "run_id": record.run_id,
        "status": state.get("status", record.status),
        "answer": state.get("answer"),
        "synthesized": state.get("synthesized"),
        "failure": None if failure is None else {k: failure[k] for k in ("kind", "message")},
        "model_calls": state.get("model_calls", 0),
        "tool_calls": state.get("tool_calls", 0),
        "usage": {"input_tokens": usage[0], "output_tokens": usage[1]},
    }


def timeline(events: list[dict[str, Any]]) -> Table:
    table = Table("step", "event", "detail", box=None, pad_edge=False, show_edge=False)
    for event in events:
        table.add_row(str(event.get("step", "")), _label(event), _detail(event))
    return table


def _label(event: dict[str, Any]) -> str:
    kind = str(event["type"])
    if kind == "model_request" and event.get("synthesis"):
        return "[bold yellow]synthesis turn[/]"
    if kind == "tool_result" and event.get("uncertain"):
        return "[bold red]effect unknown[/]"
    return {
        "run_failed": "[bold red]failed[/]",
        "run_completed": "[bold green]completed[/]",
        "approval_requested": "[bold]approval asked[/]",
        "approval_decided": "[bold]decision[/]",
    }.get(kind, kind.replace("_", " "))


def _size(chars: int) -> str:
    return f"{chars / 1000:.1f} KB" if chars >= 1000 else f"{chars} chars"


def _detail(event: dict[str, Any]) -> str:
    kind = event["type"]
    if kind == "run_started" or kind == "run_resumed":
        return f"model {event.get('model', '')}"
    if kind == "model_request":
        how = f"tool_choice={event['tool_choice']}" if event["tool_choice"] else "tools allowed"
        return f"attempt {event['attempt']} · {how} · ~{event['estimated_input_tokens']} tokens in"
    if kind == "model_response":
        calls = ", ".join(c["name"] for c in event["tool_calls"])
        usage = event["usage"]
        tokens = f"{usage['input_tokens']}+{usage['output_tokens']} tokens"
        if calls:
            return f"asks for {calls} · {tokens}"
        return "(empty turn)" if event["empty"] else f"answers · {tokens}"
    if kind == "model_error":
        retry = f" · retry in {event['retry_in']:.1f}s" if event.get("retry_in") else ""
        return f"{event.get('status') or ''} {event['message']}{retry}"[:140]
    if kind in ("tool_call", "tool_dispatched"):
        return str(event["call_key"])[:110]
    if kind == "tool_result":
        flags = [f for f in ("is_error", "truncated", "elided") if event.get(f)]
        return f"{event['name']} · {_size(event['size'])} {' '.join(flags)}".rstrip()
    if kind == "result_elided":
        return f"{_size(event['size'])} of {str(event['call_key'])[:80]} → pointer"
    if kind == "evidence_reset":
        return f"page changed: {str(event['call_key'])[:80]} (reset {event['resets']})"
    if kind == "approval_requested":
        return f"{event['call_id']} · {str(event['call_key'])[:100]}"
    if kind == "approval_decided":
        verdict = "approved" if event["approved"] else "denied"
        reason = f": {event['reason']}" if event.get("reason") else ""
        return f"{event['call_id']} {verdict} by {event['by']}{reason}"
    if kind == "run_completed":
        how = f" (synthesized: {event['synthesized']})" if event.get("synthesized") else ""
        return f"answer{how}"
    if kind == "run_failed":
        return f"{event['kind']}: {event['message']}"
    return ""
