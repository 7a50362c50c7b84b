"""Each provider's stream read back into the answer it streams (ADR 0039).

Every reader takes the stream's events (`streaming.sse_events`), hands each piece of answer
text to `on_text`, and returns the provider's complete answer as the JSON object the
transport's `from_wire` reads for a request without the stream flag, or None when the stream
ended before the answer was complete:

- Responses API: the `response` of `response.completed` (or `.incomplete`/`.failed`), as the
  provider sends it whole; text from `response.output_text.delta`.
- Chat Completions: the chunks folded into one `chat.completion` (content and each tool call's
  arguments concatenated by index, the finish reason, the usage of the last chunk).

Every text that arrives in deltas is kept as a list of its pieces and joined once at the end: a
string grown by `+` per delta copies itself whole each time, quadratic in a long stream.
- Anthropic Messages: `message_start`'s message, each content block from its start and deltas
  (text, tool input JSON, thinking, signature), `message_delta`'s stop reason and usage.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from keel.errors import ProviderError
from keel.transports.streaming import OnText

__all__ = ["Events", "read_anthropic", "read_chat", "read_responses"]

Events = AsyncIterator[dict[str, Any]]


async def read_responses(events: Events, on_text: OnText, provider: str) -> dict[str, Any] | None:
    async for event in events:
        kind = event.get("type")
        if kind == "response.output_text.delta":
            _hand(event.get("delta"), on_text)
        elif kind in ("response.completed", "response.incomplete", "response.failed"):
            response = event.get("response")
            if not isinstance(response, dict):
                raise ProviderError(f"{provider}: {kind} carries no response object")
            return response
        elif kind == "error":
            raise ProviderError(
                f"{provider}: the stream reported an error: {str(event.get('message'))[:500]}",
                retryable=True,
            )
    return None


async def read_chat(events: Events, on_text: OnText, provider: str) -> dict[str, Any] | None:
    first: dict[str, Any] | None = None
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    pieces: dict[tuple[int, str], list[str]] = {}
    """Each call's name and arguments deltas, by index, joined at the end."""
    finish: Any = None
    usage: Any = None
    extra: dict[str, list[str]] = {}
    """The refusal and reasoning deltas, joined at the end."""
    async for chunk in events:
        first = first or chunk
        if chunk.get("usage") is not None:
            usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            text = delta.get("content") if isinstance(delta, dict) else None
            if isinstance(text, str) and text:
                content.append(text)
                on_text(text)
            for key in ("refusal", "reasoning_content"):
                if isinstance(delta, dict) and isinstance(delta.get(key), str):
                    extra.setdefault(key, []).append(delta[key])
            for call in (delta.get("tool_calls") if isinstance(delta, dict) else None) or ():
                _fold_call(calls, pieces, call)
            if choice.get("finish_reason") is not None:
                finish = choice["finish_reason"]
    if first is None or finish is None:
        return None
    for (index, key), parts in pieces.items():
        calls[index]["function"][key] = "".join(parts)
    message: dict[str, Any] = {"role": "assistant"}
    message.update((key, "".join(parts)) for key, parts in extra.items())
    message["content"] = "".join(content) if content else None
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return {
        "id": first.get("id"),
        "object": "chat.completion",
        "created": first.get("created"),
        "model": first.get("model"),
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": usage,
    }


def _fold_call(
    calls: dict[int, dict[str, Any]], pieces: dict[tuple[int, str], list[str]], part: Any
) -> None:
    if not isinstance(part, dict) or not isinstance(part.get("index"), int):
        return
    call = calls.setdefault(
        part["index"], {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
    )
    if part.get("id"):
        call["id"] = part["id"]
    function = part.get("function") or {}
    if isinstance(function, dict):
        for key in ("name", "arguments"):
            if isinstance(function.get(key), str):
                pieces.setdefault((part["index"], key), []).append(function[key])


async def read_anthropic(events: Events, on_text: OnText, provider: str) -> dict[str, Any] | None:
    message: dict[str, Any] | None = None
    blocks: dict[int, dict[str, Any]] = {}
    parts: dict[tuple[int, str], list[str]] = {}
    """Each block's deltas by field (text, input JSON, thinking, signature), joined once at the
    end: a string grown by `+` per delta copies itself whole each time (quadratic)."""
    async for event in events:
        kind = event.get("type")
        if kind == "message_start" and isinstance(event.get("message"), dict):
            message = dict(event["message"])
        elif kind == "content_block_start" and isinstance(event.get("content_block"), dict):
            blocks[_index(event)] = dict(event["content_block"])
        elif kind == "content_block_delta":
            _fold_block(blocks, parts, _index(event), event.get("delta") or {}, on_text)
        elif kind == "message_delta" and message is not None:
            message.update(event.get("delta") or {})
            message["usage"] = {**(message.get("usage") or {}), **(event.get("usage") or {})}
        elif kind == "message_stop" and message is not None:
            for (index, field), pieces in parts.items():
                block = blocks[index]
                if field == "input":
                    block["input"] = _json_input("".join(pieces), provider)
                else:
                    block[field] = str(block.get(field) or "") + "".join(pieces)
            message["content"] = [blocks[i] for i in sorted(blocks)]
            return message
        elif kind == "error":
            error = event.get("error") or {}
            raise ProviderError(
                f"{provider}: the stream reported an error: {str(error)[:500]}", retryable=True
            )
    return None


def _index(event: dict[str, Any]) -> int:
    index = event.get("index")
    return index if isinstance(index, int) else 0


_DELTA_FIELDS = {
    "text_delta": ("text", "text"),
    "input_json_delta": ("partial_json", "input"),
    "thinking_delta": ("thinking", "thinking"),
    "signature_delta": ("signature", "signature"),
}
"""A delta's type: the key its piece is under, and the block field the pieces make."""


def _fold_block(
    blocks: dict[int, dict[str, Any]],
    parts: dict[tuple[int, str], list[str]],
    index: int,
    delta: dict[str, Any],
    on_text: OnText,
) -> None:
    block = blocks.setdefault(index, {"type": "text", "text": ""})
    if delta.get("type") == "citations_delta" and isinstance(delta.get("citation"), dict):
        # a text block's source (a web search result, a fetched page), one delta each
        block["citations"] = [*(block.get("citations") or ()), delta["citation"]]
        return
    fields = _DELTA_FIELDS.get(str(delta.get("type")))
    if fields is None or not isinstance(delta.get(fields[0]), str):
        return
    piece = delta[fields[0]]
    parts.setdefault((index, fields[1]), []).append(piece)
    if fields[1] == "text":
        _hand(piece, on_text)


def _json_input(text: str, provider: str) -> Any:
    if not text:
        return {}
    try:
        return json.loads(text)
    except ValueError:
        raise ProviderError(
            f"{provider}: a streamed tool input is not JSON: {text[:200]!r}"
        ) from None


def _hand(text: Any, on_text: OnText) -> None:
    if isinstance(text, str) and text:
        on_text(text)
