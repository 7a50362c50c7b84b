"""Recordings from traces: OpenTelemetry GenAI spans and the OpenAI Agents SDK's own spans,
exported as JSON.

Three shapes of span are read, from a JSON document or JSON lines (a line may hold many):

    OTLP JSON      `{"resourceSpans": [{"scopeSpans": [{"spans": [...]}]}]}`, what the OTLP
                   exporters and the collector's file exporter write: `traceId`, `spanId`,
                   `startTimeUnixNano`, `attributes` as `[{"key", "value": {"stringValue"}}]`,
                   `status.code` 2 (or `STATUS_CODE_ERROR`) for an error
    flat spans     one object per span with `attributes` as an object, `context.trace_id`,
                   `start_time` (the SDKs' console exporters); a list of them, or `{"spans"}`
    Agents SDK     `{"object": "trace.span", "trace_id", "started_at", "span_data": {"type":
                   "function", "name", "input", "output"}, "error"}`; a list, or `{"data"}`
                   as its exporter posts them

A tool call is a span with `gen_ai.operation.name` `execute_tool` or a `gen_ai.tool.name`
(GenAI semantic conventions), its arguments `gen_ai.tool.call.arguments`, its result
`gen_ai.tool.call.result` (opt-in content: None where absent), an error from the span's status
or `error.type`; in the Agents SDK, a `function` span; in OpenInference's conventions (Arize
Phoenix and its instrumentors), a span whose `openinference.span.kind` is `TOOL`: `tool.name`,
its arguments `input.value`, its result `output.value`. A model call (`gen_ai.operation.name`
chat, text_completion or generate_content; a `generation` or `response` span; an OpenInference
`LLM` span, its model `llm.model_name`) starts a turn:
the tool spans after it, by start time, are that turn's calls. A trace without model spans
gives one call per turn. One recording per trace id, in the order the traces first appear.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from keel.informative import says_nothing
from keel.replay.lines import Bounds
from keel.replay.recorded import WRONG, Recorded, Recording, Skipped, digest, parse_arguments

__all__ = ["is_spans", "read_spans"]

_MODEL_OPERATIONS = ("chat", "text_completion", "generate_content")
_MODEL_SPANS = ("generation", "response")
_ERROR_CODES = (2, "2", "STATUS_CODE_ERROR", "ERROR", "error")


@dataclass(frozen=True, slots=True)
class _Span:
    trace: str
    start: float
    order: int
    call: Recorded | None
    """The tool call, or None for a model call."""
    model: str = ""


def is_spans(data: Any) -> bool:
    """Whether a parsed value holds spans of one of the three shapes."""
    if isinstance(data, list):
        return bool(data) and _is_span(data[0])
    if not isinstance(data, dict):
        return False
    if "resourceSpans" in data:
        return True
    for key in ("data", "spans"):
        items = data.get(key)
        if isinstance(items, list) and items and _is_span(items[0]):
            return True
    return _is_span(data)


def _is_span(item: Any) -> bool:
    if not isinstance(item, dict):
        return False
    if item.get("object") in ("trace", "trace.span") or "span_data" in item:
        return True
    return "attributes" in item and ("spanId" in item or "context" in item or "span_id" in item)


def read_spans(
    values: Iterable[tuple[str, Any]], skipped: list[Skipped], bounds: Bounds
) -> Iterator[Recording]:
    """One recording per trace, from the spans in `values` (where, parsed JSON)."""
    traces: dict[str, list[_Span]] = {}
    order, where = 0, ""
    for where, data in values:
        for item in _items(data, where, skipped):
            span = _span(item, order, where, skipped, bounds)
            order += 1
            if span is not None:
                traces.setdefault(span.trace, []).append(span)
    if not traces and where:
        skipped.append(Skipped(where, "no tool or model spans in it"))
    for trace, spans in traces.items():
        spans.sort(key=lambda s: (s.start, s.order))
        turns: list[tuple[Recorded, ...]] = []
        current: list[Recorded] = []
        has_model = any(s.call is None for s in spans)
        for span in spans:
            if span.call is None or not has_model:
                if current:
                    turns.append(tuple(current))
                current = []
            if span.call is not None:
                current.append(span.call)
        if current:
            turns.append(tuple(current))
        model = next((s.model for s in spans if s.model), "")
        yield Recording(id=trace, turns=tuple(turns), corpus="otel", model=model)


def _items(data: Any, where: str, skipped: list[Skipped]) -> Iterator[dict[str, Any]]:
    """The span objects of one value, whichever shape holds them."""
    if isinstance(data, list):
        for item in data:
            if isinstance(item, dict):
                yield item
        return
    if not isinstance(data, dict):
        skipped.append(Skipped(where, "not a span, a list of spans or an OTLP export"))
        return
    if isinstance(data.get("resourceSpans"), list):
        for resource in data["resourceSpans"]:
            scopes = resource.get("scopeSpans") if isinstance(resource, dict) else None
            if not isinstance(scopes, list) and isinstance(resource, dict):
                scopes = resource.get("instrumentationLibrarySpans")  # before OTLP 1.0
            for scope in scopes if isinstance(scopes, list) else ():
                spans = scope.get("spans") if isinstance(scope, dict) else None
                for item in spans if isinstance(spans, list) else ():
                    if isinstance(item, dict):
                        yield item
        return
    for key in ("data", "spans"):
        if isinstance(data.get(key), list):
            yield from _items(data[key], where, skipped)
            return
    yield data


def _span(
    item: dict[str, Any], order: int, where: str, skipped: list[Skipped], bounds: Bounds
) -> _Span | None:
    if item.get("object") == "trace":  # the Agents SDK's trace record: no call in it
        return None
    context = item.get("context")
    context = context if isinstance(context, dict) else {}
    trace = str(item.get("traceId") or item.get("trace_id") or context.get("trace_id") or where)
    start = _start(item)
    data = item.get("span_data")
    if isinstance(data, dict):  # the Agents SDK's own span
        kind = data.get("type")
        if kind in _MODEL_SPANS:
            return _Span(trace, start, order, None, str(data.get("model") or ""))
        if kind != "function" or not isinstance(data.get("name"), str):
            return None
        raw, output, error = data.get("input"), data.get("output"), item.get("error") is not None
        name: str = data["name"]
    else:
        attributes = _attributes(item.get("attributes"))
        operation = attributes.get("gen_ai.operation.name")
        if operation in _MODEL_OPERATIONS:
            model = attributes.get("gen_ai.response.model") or attributes.get(
                "gen_ai.request.model"
            )
            return _Span(trace, start, order, None, str(model or ""))
        tool = attributes.get("gen_ai.tool.name")
        if operation != "execute_tool" and tool is None:
            return _openinference(item, attributes, trace, start, order, where, skipped, bounds)
        if not isinstance(tool, str):
            name = str(item.get("name") or "").strip()
            name = name.removeprefix("execute_tool").strip()  # the span name: `execute_tool NAME`
            if not name:
                skipped.append(Skipped(where, "an execute_tool span without a tool name"))
                return None
        else:
            name = tool
        raw = attributes.get("gen_ai.tool.call.arguments")
        output = attributes.get("gen_ai.tool.call.result")
        error = "error.type" in attributes or _status_error(item.get("status"))
    arguments = parse_arguments(raw, bounds)
    if arguments is WRONG:
        arguments = raw  # a structured value (newer conventions allow any): kept as it is
    text = output if isinstance(output, str) or output is None else _text(output)
    call = Recorded(
        name,
        arguments,
        None if text is None else digest(text),
        empty=text is not None and says_nothing(text),
        error=error,
        chars=None if text is None else len(text),
    )
    return _Span(trace, start, order, call)


def _attributes(raw: Any) -> dict[str, Any]:
    """Attributes as an object, from either the flat shape or OTLP's key/value list."""
    if isinstance(raw, dict):
        return raw
    found: dict[str, Any] = {}
    for pair in raw if isinstance(raw, list) else ():
        if isinstance(pair, dict) and isinstance(pair.get("key"), str):
            found[pair["key"]] = _any_value(pair.get("value"))
    return found


def _any_value(value: Any) -> Any:
    """An OTLP `AnyValue`: its one field, whichever it is."""
    if not isinstance(value, dict):
        return value
    for field in ("stringValue", "boolValue", "intValue", "doubleValue", "bytesValue"):
        if field in value:
            return value[field]
    if isinstance(value.get("arrayValue"), dict):
        return [_any_value(v) for v in value["arrayValue"].get("values") or []]
    if isinstance(value.get("kvlistValue"), dict):
        return _attributes(value["kvlistValue"].get("values"))
    return None


def _status_error(status: Any) -> bool:
    if not isinstance(status, dict):
        return False
    return status.get("code") in _ERROR_CODES or status.get("status_code") in _ERROR_CODES


def _start(item: dict[str, Any]) -> float:
    """The span's start, in seconds; infinity when it has none (kept in file order)."""
    nanos = item.get("startTimeUnixNano")
    if isinstance(nanos, int | str):
        try:
            return int(nanos) / 1e9
        except (ValueError, OverflowError):  # not a number, or one past what a float holds
            pass
    stamp = item.get("start_time") or item.get("started_at")
    if isinstance(stamp, str):
        try:
            return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
        except (ValueError, OverflowError, OSError):  # not a time, or one the clock cannot hold
            pass
    return float("inf")


def _text(value: Any) -> str:
    try:
        return json.dumps(value, sort_keys=True, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)


def _openinference(
    item: dict[str, Any],
    attributes: dict[str, Any],
    trace: str,
    start: float,
    order: int,
    where: str,
    skipped: list[Skipped],
    bounds: Bounds,
) -> _Span | None:
    """A span in OpenInference's conventions: an `LLM` span starts a turn, a `TOOL` span is a
    call; any other span (a chain, an agent, a retriever) is passed over."""
    kind = str(attributes.get("openinference.span.kind") or "").upper()
    if kind == "LLM":
        model = attributes.get("llm.model_name") or attributes.get("gen_ai.request.model")
        return _Span(trace, start, order, None, str(model or ""))
    if kind != "TOOL":
        return None
    name = attributes.get("tool.name")
    if not isinstance(name, str) or not name.strip():
        name = str(item.get("name") or "").strip()
    if not name:
        skipped.append(Skipped(where, "an OpenInference TOOL span without a tool name"))
        return None
    raw, output = attributes.get("input.value"), attributes.get("output.value")
    arguments = parse_arguments(raw, bounds)
    if arguments is WRONG:
        arguments = raw
    text = output if isinstance(output, str) or output is None else _text(output)
    call = Recorded(
        name,
        arguments,
        None if text is None else digest(text),
        empty=text is not None and says_nothing(text),
        error=_status_error(item.get("status")) or "exception.type" in attributes,
        chars=None if text is None else len(text),
    )
    return _Span(trace, start, order, call)
