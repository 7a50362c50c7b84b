"""How `keel show` presents a run: the JSON contract, a readable timeline, and under it how
much of the run's input a prompt cache could serve."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rich.markup import escape

from keel.present.terminal import describe_call, safe_text
from keel.records import (
    ApprovalDecided,
    ApprovalRequested,
    ContextShrunk,
    Event,
    EvidenceRejected,
    EvidenceReset,
    HookApplied,
    HostedToolCalled,
    ModelErrorSeen,
    ModelRequestSent,
    ModelResponseReceived,
    OutputRejected,
    ResultClamped,
    ResultElided,
    RunCompleted,
    RunFailed,
    RunResumed,
    RunStarted,
    ToolCallRequested,
    ToolChoiceIgnored,
    ToolDispatched,
    ToolResultRecorded,
    UnknownEvent,
)
from keel.store import RunRecord

if TYPE_CHECKING:
    from rich.table import Table

__all__ = [
    "PromptCacheShare",
    "json_text",
    "prompt_cache_share",
    "run_json",
    "timeline",
]


def json_text(value: Any) -> str:
    """`value` as the one line of JSON `keel run --json` and `keel show --json` print: always
    valid JSON. Nothing non-finite enters a run any more (providers' answers are checked), but
    a run stored before that may hold a NaN; it is printed as null rather than as ``NaN``."""
    return json.dumps(_finite(value), ensure_ascii=False, allow_nan=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def run_json(record: RunRecord) -> dict[str, Any]:
    """The run's fields, the same as `keel run --json` prints (a fork's: where it branched)."""
    shown = record.state.result(record.run_id, record.conversation_id).to_dict()
    origin = record.config.settings.get("forked_from")
    if isinstance(origin, dict):
        shown["forked_from"] = origin
    return shown


@dataclass(frozen=True, slots=True)
class PromptCacheShare:
    """How much of a run's input repeated the request before it, by Keel's estimate and, where
    the provider reports cached tokens, by the provider's own count."""

    requests: int
    estimated_tokens: int
    """Input tokens of all the requests, as the context builder estimated them."""
    repeated_tokens: int
    """Of those, the tokens at the start of each request that repeat the previous one."""
    provider_tokens: int
    """Input tokens the provider reported (0: it reports none, e.g. a scripted model)."""
    provider_cached: int
    """Of those, the ones the provider served from its prompt cache."""

    @property
    def share(self) -> float:
        return self.repeated_tokens / self.estimated_tokens if self.estimated_tokens else 0.0

    @property
    def provider_share(self) -> float | None:
        return self.provider_cached / self.provider_tokens if self.provider_tokens else None

    def describe(self) -> str:
        line = (
            f"prompt cache: {self.share:.0%} of the input tokens of {self.requests} requests "
            "repeat the previous request's prefix (estimated)"
        )
        if self.provider_share is not None:
            line += (
                f"; the model reported {self.provider_share:.0%} of its "
                f"{self.provider_tokens:,} input tokens served from its cache"
            )
        return line


def prompt_cache_share(events: list[Event]) -> PromptCacheShare | None:
    """The run's prompt-cache figures; None when it sent no request that recorded them (stores
    written before they were recorded)."""
    sent = [e for e in events if isinstance(e, ModelRequestSent)]
    measured = [e.repeated_prefix_tokens for e in sent if e.repeated_prefix_tokens is not None]
    if not measured:
        return None
    usages = [e.usage for e in events if isinstance(e, ModelResponseReceived)]
    return PromptCacheShare(
        requests=len(measured),
        estimated_tokens=sum(
            e.estimated_input_tokens for e in sent if e.repeated_prefix_tokens is not None
        ),
        repeated_tokens=sum(measured),
        provider_tokens=sum(u.input_tokens for u in usages),
        provider_cached=sum(u.cached_input_tokens for u in usages),
    )


def timeline(events: list[Event]) -> Table:
    """One row per event, and the prompt-cache figures below (the table's caption)."""
    from rich.table import Table  # `keel show` only; every run imports this module (ADR 0042)

    cache = prompt_cache_share(events)
    table = Table(
        "step",
        "event",
        "detail",
        box=None,
        pad_edge=False,
        show_edge=False,
        caption=cache.describe() if cache else None,
        caption_justify="left",
    )
    for event in events:
        table.add_row(str(event.step), _label(event), escape(safe_text(_detail(event))))
    return table


def _label(event: Event) -> str:
    match event:
        case ModelRequestSent(synthesis=str()):
            return "[bold yellow]synthesis turn[/]"
        case ToolResultRecorded(uncertain=True):
            return "[bold red]effect unknown[/]"
        case ToolChoiceIgnored():
            return "[bold red]tool_choice ignored[/]"
        case RunFailed():
            return "[bold red]failed[/]"
        case RunCompleted():
            return "[bold green]completed[/]"
        case ApprovalRequested():
            return "[bold]approval asked[/]"
        case ApprovalDecided():
            return "[bold]decision[/]"
        case HookApplied():
            return "[bold]hook[/]"
        case UnknownEvent():
            return escape(safe_text(event.type_name.replace("_", " ")))
    return event.type.replace("_", " ")


def _size(chars: int) -> str:
    return f"{chars / 1000:.1f} KB" if chars >= 1000 else f"{chars} chars"


def decision_text(event: ApprovalDecided) -> str:
    """A decision as `keel show` prints it: what was decided, by whom, and how."""
    reason = f": {event.reason}" if event.reason else ""
    if event.answer is not None:
        return f"{event.call_id} answered instead by {event.by}: {event.answer}"[:300]
    if not event.approved:
        how = " (the approval expired)" if event.expired else ""
        return f"{event.call_id} denied by {event.by}{how}{reason}"
    edited = (
        f" with edited arguments {_short_json(event.arguments)}"
        if event.arguments is not None
        else ""
    )
    rule = f"; {event.name} approved for the rest of the run" if event.for_run else ""
    return f"{event.call_id} approved by {event.by}{edited}{rule}{reason}"


def _short_json(value: object) -> str:
    text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= 200 else text[:199] + "…"


def _skipped(content: str) -> str:
    """`` · skipped: .venv (a virtual environment); ...`` when a file tool's result says what
    its walk left out (ADR 0057), else nothing."""
    from keel.tools.ignore import skipped_in

    found = skipped_in(content)
    return f" · skipped: {found[:140]}" if found else ""


def _detail(event: Event) -> str:
    match event:
        case RunStarted() | RunResumed():
            return f"model {event.model}"
        case ModelRequestSent():
            how = f"tool_choice={event.tool_choice}" if event.tool_choice else "tools allowed"
            size, same = event.estimated_input_tokens, event.repeated_prefix_tokens
            repeated = f" ({same} repeated)" if size and same is not None else ""
            return f"attempt {event.attempt} · {how} · ~{size} tokens in{repeated}"
        case ModelResponseReceived():
            calls = ", ".join(c.name for c in event.tool_calls)
            tokens = f"{event.usage.input_tokens}+{event.usage.output_tokens} tokens"
            tokens += " (estimated)" if event.usage.estimated else ""
            if event.cost is not None:
                tokens += f" · ${event.cost:.4f}"
            if calls:
                return f"asks for {calls} · {tokens}"
            return "(empty turn)" if event.empty else f"answers · {tokens}"
        case ModelErrorSeen():
            retry = f" · retry in {event.retry_in:.1f}s" if event.retry_in else ""
            return f"{event.status or ''} {event.message}{retry}"[:140]
        case ToolCallRequested() | ToolDispatched():
            return event.call_key[:110]
        case HostedToolCalled():
            cost = "" if event.cost is None else f" · ${event.cost:.4f}"
            how = event.error or f"{len(event.sources)} sources"
            return f"{event.name} by the provider: {event.input!r} · {how}{cost}"[:140]
        case ToolResultRecorded():
            flags = [f for f in ("is_error", "truncated", "elided") if getattr(event, f)]
            if event.answered_by:
                flags.append(f"answered by {event.answered_by}, not run")
            said = f"{event.name} · {_size(event.size)} {' '.join(flags)}".rstrip()
            first = next((line.strip() for line in event.content.splitlines() if line.strip()), "")
            said = f"{said} · {first[:100]}" if first else said
            return said + _skipped(event.content)
        case HookApplied():
            on = f" on {event.call_id}" if event.call_id else ""
            detail = f": {_short_json(event.detail)}" if event.detail is not None else ""
            return f"{event.hook}.{event.point}{on} {event.action}{detail}"[:300]
        case ResultElided():
            return f"{_size(event.size)} of {event.call_key[:80]} → pointer"
        case ResultClamped():
            return f"{_size(event.size)} of {event.call_key[:80]} → {_size(event.shown)} shown"
        case ContextShrunk():
            said = f" (its window: {event.window:,})" if event.window else ""
            again = f"sent again within ~{event.limit:,}"
            return f"refused as too long at ~{event.sent:,} tokens{said}; {again}"
        case EvidenceReset():
            return f"page changed: {event.call_key[:80]} (reset {event.resets})"
        case ToolChoiceIgnored():
            return f"asked tool_choice={event.requested}; the answer came without a tool call"
        case ApprovalRequested():
            note = f"\nnote: {event.note}" if event.note else ""
            call = "\n".join(describe_call(event.name, event.arguments))
            return f"{event.call_id} · {call}{note}"
        case ApprovalDecided():
            return decision_text(event)
        case RunCompleted():
            how = f" (synthesized: {event.synthesized})" if event.synthesized else ""
            cut = " · cut off at the output limit or the model timeout" if event.cut_off else ""
            shaped = ""
            if event.output is not None:
                shaped = " · structured output" + (", partial" if event.partial else "")
            checked = ""
            if isinstance(event.evidence, dict):
                from keel.citations import summary_line

                checked = f" · evidence: {summary_line(event.evidence)}"
            partial = " · partial" if event.partial and event.output is None else ""
            return f"answer{how}{cut}{shaped}{partial}{checked}"
        case RunFailed():
            return f"{event.kind}: {event.message}"
        case OutputRejected():
            return f"answer rejected by the output schema: {event.feedback}"[:200]
        case EvidenceRejected():
            return f"answer sent back once, its citations did not check: {event.feedback}"[:300]
    return ""
