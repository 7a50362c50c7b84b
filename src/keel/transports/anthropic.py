"""Anthropic Messages API: ``tool_use`` / ``tool_result`` blocks, ``tool_choice {"type": "none"}``
(and ``{"type": "any"}`` for Keel's "required").

The mapping is pure and tested offline (STYLE.md point 5): `to_wire` turns a ModelRequest into
the request body, `from_wire` and `map_usage` read the response body, `map_error` turns an SDK
exception into a ProviderError. `AnthropicTransport.request` is the thin shell around one
``messages.create`` call; the SDK never retries (``max_retries=0``), the gateway does.

Round-tripped vendor data: ``provider_details["anthropic_thinking"]`` holds the response's
``thinking`` / ``redacted_thinking`` blocks exactly as received (signatures included). The API
requires them back, unchanged and before the ``tool_use`` blocks, when a thinking turn that
called tools is replayed.

Prompt caching: Anthropic caches nothing unless asked, at ``cache_control`` breakpoints (at most
four per request), each caching the prompt up to and including its block. Keel marks the last
tool definition and the system block (the frozen prefix, the same for every turn), the last
settled history item (`ModelRequest.settled_items`: nothing before it changes for the rest of
the run, so it still serves after the context builder elides the results that follow it) and the
last history item (the next request extends this one). The volatile controls come after every
breakpoint, so they are never cached or read from a cache. See ADR 0021.

The SDK (anthropic 2.x) is built on ``httpx2`` and refuses ``httpx`` objects, while Keel and its
tests inject ``httpx.AsyncClient``; `_HttpxBridge` carries each request across unchanged.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

import anthropic
import httpx
import httpx2
from anthropic.types import Message as SdkMessage

from keel.errors import ConfigError, ProviderError
from keel.messages import (
    AssistantMessage,
    Item,
    ModelRequest,
    ModelResponse,
    ToolCall,
    ToolResult,
    Usage,
    wire_call_ids,
)
from keel.transports.policy import attempt, is_retryable, parse_retry_after, scrub

__all__ = [
    "CACHE_BREAKPOINT",
    "THINKING_KEY",
    "AnthropicTransport",
    "from_wire",
    "map_error",
    "map_usage",
    "to_wire",
]

THINKING_KEY = "anthropic_thinking"
"""The `provider_details` key of the opaque thinking blocks a replayed turn must carry."""
_OPAQUE_BLOCKS = frozenset({"thinking", "redacted_thinking"})
CACHE_BREAKPOINT: dict[str, str] = {"type": "ephemeral"}
"""The ``cache_control`` value of a breakpoint (the default five-minute cache)."""

_Block = dict[str, Any]
_Turn = dict[str, Any]


# --- to the wire -----------------------------------------------------------------------------


def to_wire(request: ModelRequest, *, model: str, max_tokens: int) -> dict[str, Any]:
    """The Messages API body for `request`: system apart, roles alternating, controls last,
    cache breakpoints on the frozen prefix and the history (see the module docstring)."""
    marked = {request.settled_items - 1, len(request.items) - 1} - {-1}
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "messages": _messages(request.items, request.volatile, marked),
    }
    if request.system:
        body["system"] = [
            {"type": "text", "text": request.system, "cache_control": CACHE_BREAKPOINT}
        ]
    if request.tools:
        # Kept in synthesis turns too: the replayed tool_use blocks must name declared tools.
        body["tools"] = [
            {"name": t.name, "description": t.description, "input_schema": t.parameters}
            for t in request.tools
        ]
        body["tools"][-1]["cache_control"] = CACHE_BREAKPOINT
        # Without tools the model cannot call one anyway, so neither needs a key then.
        if request.tool_choice == "none":
            body["tool_choice"] = {"type": "none"}
        elif request.tool_choice == "required":
            body["tool_choice"] = {"type": "any"}
    return body


def _messages(items: Iterable[Item], volatile: Iterable[str], marked: set[int]) -> list[_Turn]:
    """Turns in history order, the items at the `marked` indexes ending in a cache breakpoint.
    An assistant turn with nothing to send (no text, no calls) is left out: the API accepts no
    empty message, and the merge keeps the roles alternating."""
    items = tuple(items)
    ids = wire_call_ids(items)
    messages: list[_Turn] = []
    for index, item in enumerate(items):
        if isinstance(item, AssistantMessage):
            role, blocks = "assistant", _assistant_blocks(item, ids)
        elif isinstance(item, ToolResult):
            role, blocks = "user", [_tool_result_block(item, ids)]
        else:
            role, blocks = "user", [{"type": "text", "text": item.text}]
        if index in marked:
            _mark(blocks)
        _append(messages, role, blocks)
    for message in messages:
        if message["role"] == "user":
            # The API wants a turn's tool_result blocks before any text in the same message.
            message["content"].sort(key=lambda block: block["type"] != "tool_result")
    _append(messages, "user", [{"type": "text", "text": text} for text in volatile])
    return messages


def _mark(blocks: list[_Block]) -> None:
    """A breakpoint on the item's last block (thinking blocks cannot carry one; they come
    first, so an item with only those gets none)."""
    for block in reversed(blocks):
        if block["type"] not in _OPAQUE_BLOCKS:
            block["cache_control"] = CACHE_BREAKPOINT
            return


def _append(messages: list[_Turn], role: str, blocks: list[_Block]) -> None:
    """Add `blocks` as a `role` turn, merged into the previous turn if it has the same role:
    the API rejects two user (or two assistant) messages in a row."""
    if not blocks:
        return
    if messages and messages[-1]["role"] == role:
        messages[-1]["content"].extend(blocks)
    else:
        messages.append({"role": role, "content": blocks})


def _assistant_blocks(message: AssistantMessage, ids: Mapping[str, str]) -> list[_Block]:
    blocks: list[_Block] = [dict(b) for b in message.provider_details.get(THINKING_KEY, ())]
    if message.text and message.text.strip():
        blocks.append({"type": "text", "text": message.text})
    blocks.extend(_tool_use_block(call, ids[call.id]) for call in message.tool_calls)
    return blocks


def _tool_use_block(call: ToolCall, wire_id: str) -> _Block:
    # Unparseable (or non-object) arguments go out as {} under the same id, so the call still
    # pairs with its error result and the history stays valid.
    arguments = call.arguments if call.parse_error is None else None
    payload = arguments if isinstance(arguments, dict) else {}
    return {"type": "tool_use", "id": wire_id, "name": call.name, "input": payload}


def _tool_result_block(result: ToolResult, ids: Mapping[str, str]) -> _Block:
    block: _Block = {
        "type": "tool_result",
        "tool_use_id": ids.get(result.call_id, result.call_id),
        "content": result.content,
    }
    if result.is_error:
        block["is_error"] = True
    return block


# --- from the wire ---------------------------------------------------------------------------


def from_wire(data: Mapping[str, Any]) -> ModelResponse:
    """A Messages API response body (a ``message`` object) as a ModelResponse."""
    texts: list[str] = []
    calls: list[ToolCall] = []
    opaque: list[_Block] = []
    for block in data.get("content") or ():
        kind = block.get("type")
        if kind == "text":
            texts.append(block.get("text") or "")
        elif kind == "tool_use":
            arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
            calls.append(ToolCall.from_raw(block["id"], block["name"], arguments))
        elif kind in _OPAQUE_BLOCKS:
            opaque.append(dict(block))
    return ModelResponse(
        text="".join(texts) if texts else None,
        tool_calls=tuple(calls),
        usage=map_usage(data.get("usage")),
        stop_reason=data.get("stop_reason"),
        provider_details={THINKING_KEY: opaque} if opaque else {},
        response_id=data.get("id") if isinstance(data.get("id"), str) else None,
    )


def map_usage(usage: Mapping[str, Any] | None) -> Usage:
    """Anthropic counts cache reads and writes apart from ``input_tokens``; Keel's input count
    is the whole prompt, so the three are summed. Missing or null fields count as 0."""
    usage = usage or {}
    read = usage.get("cache_read_input_tokens") or 0
    created = usage.get("cache_creation_input_tokens") or 0
    return Usage(
        input_tokens=(usage.get("input_tokens") or 0) + read + created,
        output_tokens=usage.get("output_tokens") or 0,
        cached_input_tokens=read,
    )


# --- errors ----------------------------------------------------------------------------------


def map_error(
    exc: anthropic.AnthropicError, *, now: float | None = None, secret: str | None = None
) -> ProviderError:
    """The one place SDK exceptions become ProviderErrors, classified by the provider policy
    (`keel.transports.policy`). `secret` (the API key) is scrubbed from the message in case a
    proxy echoes it; `now` is for Retry-After dates."""
    if isinstance(exc, anthropic.APIStatusError):
        status = exc.status_code
        kind = exc.type or "error"
        detail = exc.api_message or _short(exc.body) or exc.message
        message = f"anthropic: HTTP {status} {kind}: {detail}"
        if exc.request_id:
            message += f" (request-id {exc.request_id})"
        error = ProviderError(
            scrub(message, secret),
            status=status,
            retryable=is_retryable(status, exc.type),
            retry_after=parse_retry_after(exc.response.headers, now),
        )
    elif isinstance(exc, anthropic.APITimeoutError):
        message = f"anthropic: request timed out: {_root_cause(exc)}"
        error = ProviderError(scrub(message, secret), retryable=True)
    elif isinstance(exc, anthropic.APIConnectionError):
        message = f"anthropic: connection failed: {_root_cause(exc)}"
        error = ProviderError(scrub(message, secret), retryable=True)
    else:  # a response that did not match the schema, missing credentials, another SDK failure
        error = ProviderError(scrub(f"anthropic: {exc}", secret), retryable=False)
    return error


def _short(body: object) -> str:
    return body.strip()[:300] if isinstance(body, str) else ""


def _root_cause(exc: BaseException) -> str:
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


# --- the shell -------------------------------------------------------------------------------


class _HttpxBridge(httpx2.AsyncBaseTransport):
    """Sends the SDK's httpx2 requests through an injected httpx client, unchanged.

    The SDK's per-request timeout travels along (httpx's 5 s default would cut long answers
    short); the client's other settings apply. Bodies arrive decoded, so the encoding headers
    are dropped rather than have httpx2 decode them twice."""

    _DROPPED = frozenset({"content-encoding", "content-length", "transfer-encoding"})

    def __init__(self, client: httpx.AsyncClient) -> None:
        self._client = client

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        outgoing = self._client.build_request(
            request.method,
            str(request.url),
            headers=request.headers.multi_items(),
            content=await request.aread(),
            extensions={k: v for k, v in request.extensions.items() if k == "timeout"},
        )
        try:
            response = await self._client.send(outgoing)
        except httpx.TimeoutException as exc:  # the SDK reports httpx2 timeouts as timeouts
            raise httpx2.TimeoutException(str(exc), request=request) from exc
        except httpx.HTTPError as exc:
            raise httpx2.TransportError(str(exc), request=request) from exc
        headers = [(k, v) for k, v in response.headers.multi_items() if k not in self._DROPPED]
        return httpx2.Response(
            response.status_code, headers=headers, content=response.content, request=request
        )


class AnthropicTransport:
    """One Messages API call per `request`, through the official SDK (no SDK retries).

    Pass either a ready `client` or the parts to build one: `http_client` (httpx or httpx2),
    `base_url` and `api_key` (default: ``ANTHROPIC_API_KEY``). The key is handed to the SDK
    and kept nowhere else."""

    def __init__(
        self,
        model: str,
        *,
        client: anthropic.AsyncAnthropic | None = None,
        http_client: httpx.AsyncClient | httpx2.AsyncClient | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        max_tokens: int = 4096,
    ) -> None:
        if not model:
            raise ConfigError("AnthropicTransport needs a model name, e.g. 'claude-sonnet-4-6'")
        if max_tokens < 1:
            raise ConfigError(f"max_tokens must be at least 1, not {max_tokens}")
        if client is not None:
            if http_client is not None or base_url is not None or api_key is not None:
                raise ConfigError("pass either client or http_client/base_url/api_key, not both")
            self._client = client.with_options(max_retries=0)
        else:
            key = api_key or os.environ.get("ANTHROPIC_API_KEY")
            if not key:
                raise ConfigError(
                    "the Anthropic transport needs an API key: set ANTHROPIC_API_KEY "
                    "or pass api_key"
                )
            if isinstance(http_client, httpx.AsyncClient):
                http_client = httpx2.AsyncClient(transport=_HttpxBridge(http_client))
            self._client = anthropic.AsyncAnthropic(
                api_key=key, base_url=base_url, http_client=http_client, max_retries=0
            )
        self.model = model
        self.max_tokens = max_tokens
        self.name = f"anthropic:{model}"

    def __repr__(self) -> str:
        return f"AnthropicTransport(model={self.model!r})"

    async def request(self, request: ModelRequest) -> ModelResponse:
        body = to_wire(request, model=self.model, max_tokens=self.max_tokens)
        return await attempt(
            lambda: self._send(body),
            foreign=anthropic.AnthropicError,
            to_error=map_error,
            secret=self._client.api_key,
        )

    async def _send(self, body: dict[str, Any]) -> ModelResponse:
        message: object = await self._client.messages.create(**body)
        if not isinstance(message, SdkMessage):
            # A 200 that is not JSON (a proxy's login page) comes back from the SDK as text.
            # Waiting does not fix a wrong base_url, so it fails at once.
            raise ProviderError(f"anthropic: the response is not a message: {message!r:.200}")
        return from_wire(message.to_dict(mode="json"))
