"""Anthropic Messages API: ``tool_use`` / ``tool_result`` blocks, ``tool_choice {"type": "none"}``
(and ``{"type": "any"}`` for Keel's "required").

The body and the answer are mapped, purely and tested offline, in
`keel.transports.anthropic_wire` (re-exported here); `map_error` turns an SDK exception into a
ProviderError. `AnthropicTransport.request` is the thin shell around one ``messages.create``
call; the SDK never retries (``max_retries=0``), the gateway does.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import anthropic
import httpx
import httpx2

from keel.errors import ConfigError, ProviderError
from keel.hosted import HostedTool, check_kinds
from keel.messages import ModelRequest, ModelResponse
from keel.transports.anthropic_server import continued
from keel.transports.anthropic_wire import (
    ANSWER_TOOL,
    CACHE_BREAKPOINT,
    PROVIDER,
    THINKING_KEY,
    from_wire,
    map_usage,
    to_wire,
)
from keel.transports.base import ServerToolChoice, address_of
from keel.transports.bounded import DEFAULT_MAX_RESPONSE_BYTES, bounded_client
from keel.transports.keys import endpoint_key, sent_key
from keel.transports.overflow import as_overflow
from keel.transports.policy import attempt, is_retryable, parse_retry_after, scrub
from keel.transports.sse_readers import read_anthropic
from keel.transports.streaming import OnText, cut_short, sse_events
from keel.transports.wire import decode_json

__all__ = [
    "ANSWER_TOOL",
    "ANTHROPIC_HOST",
    "CACHE_BREAKPOINT",
    "PROVIDER",
    "THINKING_KEY",
    "WEB_FETCH_BETA",
    "AnthropicTransport",
    "from_wire",
    "map_error",
    "map_usage",
    "to_wire",
]

ANTHROPIC_HOST = "api.anthropic.com"
WEB_FETCH_BETA = "web-fetch-2025-09-10"
"""The beta Anthropic's docs name for ``web_fetch_20250910`` (the SDK now types the tool among
the general ones; the header is sent in case the API still asks for it)."""


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
        error = as_overflow(  # "prompt is too long: N tokens > M maximum"
            ProviderError(
                scrub(message, secret),
                status=status,
                retryable=is_retryable(status, exc.type),
                retry_after=parse_retry_after(exc.response.headers, now),
            ),
            exc.body,
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


class AnthropicTransport:
    """One Messages API call per `request`, through the official SDK (no SDK retries).

    Pass either a ready `client` or the parts to build one: `http_client` (httpx or httpx2),
    `base_url` (default: ``ANTHROPIC_BASE_URL``, else Anthropic's) and `api_key` (default:
    ``ANTHROPIC_API_KEY`` for Anthropic itself; a server the user chose gets a placeholder
    unless given a key, `keel.transports.keys`). The key is handed to the SDK and kept nowhere
    else. `tool_choice`: sent on turns with tools that ask for nothing themselves.
    `max_response_bytes` bounds every answer, decompressed; the SDK sends through the given (or
    its default) HTTP client, bounded (`keel.transports.bounded`).
    """

    streams = True
    """It streams its answer's text to a listener (`request_streaming`, ADR 0039)."""

    def __init__(
        self,
        model: str,
        *,
        client: anthropic.AsyncAnthropic | None = None,
        http_client: httpx.AsyncClient | httpx2.AsyncClient | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        max_tokens: int = 4096,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        tool_choice: ServerToolChoice | None = None,
        hosted_tools: Iterable[HostedTool] = (),
    ) -> None:
        if not model:
            raise ConfigError("AnthropicTransport needs a model name, e.g. 'claude-sonnet-4-6'")
        if max_tokens < 1:
            raise ConfigError(f"max_tokens must be at least 1, not {max_tokens}")
        if client is not None:
            if http_client is not None or base_url is not None or api_key is not None:
                raise ConfigError("pass either client or http_client/base_url/api_key, not both")
            bounded = bounded_client(
                client._client,  # private in the SDK, and the one way to reach the caller's
                max_bytes=max_response_bytes,
                provider=PROVIDER,
            )
            self._client = client.with_options(max_retries=0, http_client=bounded)
        else:
            base_url = base_url or os.environ.get("ANTHROPIC_BASE_URL") or None
            key = endpoint_key(
                api_key,
                base_url,
                env_name="ANTHROPIC_API_KEY",
                provider_host=ANTHROPIC_HOST,
                provider="the Anthropic API",
            )
            inner = http_client if http_client is not None else anthropic.DefaultAsyncHttpxClient()
            self._client = anthropic.AsyncAnthropic(
                api_key=key,
                base_url=base_url,
                http_client=bounded_client(inner, max_bytes=max_response_bytes, provider=PROVIDER),
                max_retries=0,
            )
        self.model = model
        self.max_tokens = max_tokens
        self.tool_choice = tool_choice
        self.hosted_tools = check_kinds(hosted_tools, PROVIDER)
        """Server tools declared with every request (ADR 0067)."""
        self.name = f"anthropic:{model}"

    def __repr__(self) -> str:
        return f"AnthropicTransport(model={self.model!r})"

    @property
    def server_address(self) -> tuple[str, int]:
        return address_of(self._client.base_url)

    def secret(self) -> str | None:
        """The API key sent, scrubbed from answers (`keel.transports.base.Keyed`)."""
        return sent_key(self._client.api_key)

    def _body(self, request: ModelRequest) -> dict[str, Any]:
        """The SDK call's arguments: the body, and the beta header web fetch was introduced
        under (`WEB_FETCH_BETA`) when it is declared."""
        body = to_wire(
            request,
            model=self.model,
            max_tokens=self.max_tokens,
            tool_choice=self.tool_choice,
            hosted=self.hosted_tools,
        )
        if any(tool.kind == "web_fetch" for tool in self.hosted_tools):
            body["extra_headers"] = {"anthropic-beta": WEB_FETCH_BETA}
        return body

    async def request(self, request: ModelRequest) -> ModelResponse:
        body = self._body(request)
        structured = request.output is not None

        def read(message: dict[str, Any]) -> ModelResponse:
            return from_wire(message, structured=structured)

        async def send(sent: dict[str, Any]) -> dict[str, Any] | None:
            raw = await self._client.messages.with_raw_response.create(**sent)
            return decode_json(await raw.read(), PROVIDER)

        async def turn() -> ModelResponse:
            response = await continued(body, send, read)
            if response is None:  # a body read whole is a message or an error, never nothing
                raise ProviderError(f"{PROVIDER}: the response held no message", retryable=True)
            return response

        return await attempt(
            turn,
            foreign=anthropic.AnthropicError,
            to_error=map_error,
            secret=self._client.api_key,
        )

    async def request_streaming(self, request: ModelRequest, on_text: OnText) -> ModelResponse:
        """`request` with ``"stream": true``: text to `on_text` as it comes (ADR 0039)."""
        body = {**self._body(request), "stream": True}
        structured = request.output is not None

        def read(message: dict[str, Any]) -> ModelResponse:
            return from_wire(message, structured=structured)

        async def send(sent: dict[str, Any]) -> dict[str, Any] | None:
            create = self._client.messages.with_streaming_response.create
            async with create(**sent) as raw:
                events = sse_events(raw.iter_lines(), PROVIDER)
                return await read_anthropic(events, on_text, PROVIDER)

        return await attempt(
            lambda: cut_short(lambda: continued(body, send, read), PROVIDER),
            foreign=anthropic.AnthropicError,
            to_error=map_error,
            secret=self._client.api_key,
        )
