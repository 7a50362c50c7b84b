"""Text from outside Keel, made storable where it enters: lone surrogates become U+FFFD.

A JSON escape (`"\\ud800"`) in a model's answer or arguments, a file name that is not valid
UTF-8 (Python hands it over with `surrogateescape`), or a tool's output can hold a lone UTF-16
surrogate. Python strings carry it; UTF-8 cannot: sqlite3 and psycopg raise UnicodeEncodeError,
and a terminal, a JSON consumer or a trace exporter chokes on it later. Keel replaces each one
with U+FFFD (the replacement character, visible in every view) at the places text comes in:

    the model's response    text, tool names, call ids, arguments, provider details (turns.py)
    a provider's error      its message (turns.py)
    a tool's result         whatever the tool returned or raised, MCP tools included (executor)
    a person's decision     who decided, and the reason (approvals)

A question is refused instead (`Agent.start`): it is the person's own text, so they are told.
Text that encodes, which is nearly all of it, is returned as it is: one `str.encode` call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from keel.canonical import call_key, canonical_json
from keel.messages import ModelResponse, ToolCall
from keel.transports.policy import scrub

__all__ = ["REPLACEMENT", "clean_response", "clean_text", "clean_value"]

REPLACEMENT = "\ufffd"


def clean_text(text: str) -> str:
    """`text` with every lone surrogate replaced by U+FFFD (a valid pair becomes its
    character); the same object when there is none."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def clean_value(value: Any, fix: Callable[[str], str] = clean_text) -> Any:
    """A JSON value with every string in it (keys too) cleaned (by `fix`); the same object
    when clean."""
    if isinstance(value, str):
        return fix(value)
    if isinstance(value, dict):
        changed, out = False, {}
        for key, item in value.items():
            clean_key = fix(key) if isinstance(key, str) else key
            clean_item = clean_value(item, fix)
            changed |= clean_key is not key or clean_item is not item
            out[clean_key] = clean_item
        return out if changed else value
    if isinstance(value, list | tuple):
        items = [clean_value(v, fix) for v in value]
        if all(a is b for a, b in zip(items, value, strict=True)):
            return value
        return type(value)(items) if isinstance(value, tuple) else items
    return value


def clean_response(response: ModelResponse, secret: str | None = None) -> ModelResponse:
    """The response with nothing in it that the store, a terminal or JSON cannot hold, and
    with `secret` (the transport's API key) scrubbed from every string in it: text, calls,
    provider details (SECURITY.md: keys are never stored)."""
    fix = clean_text if secret is None else _scrubbing(secret)
    text = None if response.text is None else fix(response.text)
    calls = tuple(_clean_call(call, fix) for call in response.tool_calls)
    details = clean_value(response.provider_details, fix)
    stop = None if response.stop_reason is None else fix(response.stop_reason)
    changed = (
        text is not response.text
        or details is not response.provider_details
        or stop is not response.stop_reason
        or any(a is not b for a, b in zip(calls, response.tool_calls, strict=True))
    )
    if not changed:
        return response
    return replace(
        response, text=text, tool_calls=calls, provider_details=details, stop_reason=stop
    )


def _scrubbing(secret: str) -> Callable[[str], str]:
    """clean_text, then `secret` replaced (`keel.transports.policy.scrub`); the same object
    when there is nothing to change."""

    def fix(text: str) -> str:
        cleaned = clean_text(text)
        return scrub(cleaned, secret) if secret in cleaned else cleaned

    return fix


def _clean_call(call: ToolCall, fix: Callable[[str], str] = clean_text) -> ToolCall:
    call_id, name = fix(call.id), fix(call.name)
    raw, arguments = fix(call.raw_arguments), clean_value(call.arguments, fix)
    if (
        call_id is call.id
        and name is call.name
        and raw is call.raw_arguments
        and arguments is call.arguments
    ):
        return call
    provider_id = None if call.provider_id is None else fix(call.provider_id)
    if call.parse_error is None and isinstance(arguments, dict):
        # a JSON escape put the surrogate in the parsed arguments: key them as cleaned
        key = call_key(name, arguments)
        raw = canonical_json(arguments)
        return ToolCall(call_id, name, raw, arguments, None, key, provider_id)
    return ToolCall.from_raw(call_id, name, raw, provider_id=provider_id)
