"""What the two OpenAI transports share: the SDK client, the API key, and error mapping.

The SDK is used for what it is good at (authentication, base URLs, headers, turning HTTP
failures into typed exceptions) and kept away from what Keel owns: the SDK client is always
built with ``max_retries=0``, because the gateway decides about retries, backoff and deadlines
and a hidden second layer of retries would spend budget the run cannot see.

Every response body comes in through `keel.transports.bounded` (at most
``max_response_bytes``, decompressed, counted as it streams in) and is decoded by
`keel.transports.wire` (strict JSON; each transport then reads it against its declared shape).

Foreign exceptions are mapped once, here, by `map_error`; the transports call it at their
boundary through `keel.transports.policy.attempt`, so nothing else in Keel ever sees an
``openai`` exception and none is chained to the ProviderError. The API key is used to
build the client and to scrub error messages, and is never logged, stored or put in a message.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import httpx
import httpx2
import openai

from keel.errors import ConfigError, ProviderError
from keel.messages import ModelResponse, OutputSchema, ToolResult
from keel.transports.base import address_of
from keel.transports.bounded import DEFAULT_MAX_RESPONSE_BYTES, bounded_client
from keel.transports.keys import PLACEHOLDER_KEY, endpoint_key
from keel.transports.overflow import as_overflow
from keel.transports.policy import attempt, is_retryable, parse_retry_after, scrub
from keel.transports.sse_readers import Events
from keel.transports.streaming import OnText, cut_short, sse_events, transport_errors
from keel.transports.wire import decode_json

__all__ = [
    "ERROR_MARKER",
    "LOCAL_PLACEHOLDER_KEY",
    "OPENAI_HOST",
    "PROVIDER",
    "build_client",
    "decode_body",
    "json_schema_format",
    "map_error",
    "post",
    "post_streaming",
    "resolve_api_key",
    "server_address",
    "tool_output_text",
]

LOCAL_PLACEHOLDER_KEY = PLACEHOLDER_KEY
"""Sent to a user-chosen `base_url` when the user gave no key for it (`keel.transports.keys`):
local servers (llama.cpp, vLLM) ignore the Authorization header, but the SDK insists on one."""
OPENAI_HOST = "api.openai.com"

PROVIDER = "OpenAI API"
"""How messages about either OpenAI transport's answers begin."""

ERROR_MARKER = "ERROR: "
"""OpenAI's wire formats have no error flag on a tool result, so an error result is marked in
its text. Results that already start with "error" (Keel's own error texts do) are left alone."""


def resolve_api_key(
    api_key: str | None, base_url: str | None, env: Mapping[str, str] | None = None
) -> str:
    """The key to send: the argument; else, to OpenAI itself, OPENAI_API_KEY; else, to a
    server the user chose, a placeholder, never the environment's key (`keel.transports.keys`).
    """
    return endpoint_key(
        api_key,
        base_url,
        env_name="OPENAI_API_KEY",
        provider_host=OPENAI_HOST,
        provider="the OpenAI API",
        env=env,
    )


def build_client(
    *,
    client: openai.AsyncOpenAI | None,
    http_client: httpx.AsyncClient | httpx2.AsyncClient | None,
    base_url: str | None,
    api_key: str | None,
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
) -> openai.AsyncOpenAI:
    """The SDK client a transport talks through, never retrying on its own, every answer
    bounded by `max_response_bytes` (`keel.transports.bounded`).

    A caller's own client is copied with retries off; the copy sends through the caller's
    HTTP client (so it shares its connection pool and settings), bounded. `http_client` is the
    injection point for tests (an ``httpx.MockTransport``) and for proxies.
    """
    if client is not None:
        if http_client is not None or base_url is not None or api_key is not None:
            raise ConfigError("pass either client=... or http_client/base_url/api_key, not both")
        theirs = client._client  # private in the SDK, and the one way to reach the caller's
        bounded = bounded_client(theirs, max_bytes=max_response_bytes, provider=PROVIDER)
        return client.with_options(max_retries=0, http_client=bounded)
    base_url = base_url or os.environ.get("OPENAI_BASE_URL") or None
    inner = http_client if http_client is not None else openai.DefaultAsyncHttpxClient()
    return openai.AsyncOpenAI(
        api_key=resolve_api_key(api_key, base_url),
        base_url=base_url,
        http_client=bounded_client(inner, max_bytes=max_response_bytes, provider=PROVIDER),
        max_retries=0,
    )


async def post(
    client: openai.AsyncOpenAI,
    create: Callable[..., Awaitable[Any]],
    body: dict[str, Any],
    from_wire: Callable[[dict[str, Any]], ModelResponse],
    *,
    again_if_closed: bool = False,
) -> ModelResponse:
    """One attempt at an endpoint of `client`: `create` (the endpoint's
    ``with_raw_response.create``) sends `body`, and `from_wire` maps the decoded answer. An SDK
    exception leaves as the ProviderError `map_error` makes of it, the key scrubbed.

    `again_if_closed`: a request that finds its connection closed before any answer is sent
    once more. For the whole request after a stream of nothing (`post_streaming`): the server
    closes the connection that stream came on, and the pool may hand it out again first."""

    async def send() -> ModelResponse:
        try:
            raw = await create(**body)
        except openai.APIConnectionError as exc:
            if not again_if_closed or isinstance(exc, openai.APITimeoutError):
                raise
            raw = await create(**body)
        return from_wire(decode_body(raw.content))

    return await attempt(
        send, foreign=openai.OpenAIError, to_error=map_error, secret=client.api_key
    )


def server_address(client: openai.AsyncOpenAI) -> tuple[str, int]:
    """Where `client` sends requests, for traces: host and port (the scheme's default)."""
    return address_of(client.base_url)


def json_schema_format(output: OutputSchema) -> dict[str, Any]:
    """OpenAI's structured-output format for a schema, as both APIs take it (the Responses
    API flat in ``text.format``, Chat Completions under ``response_format.json_schema``).
    ``strict`` is off: strict mode accepts only schemas with every property required and no
    additional properties, which most pydantic models and user schemas are not; Keel
    validates every answer itself (keel/structured.py)."""
    return {"type": "json_schema", "name": output.name, "schema": output.schema, "strict": False}


async def post_streaming(
    client: openai.AsyncOpenAI,
    create: Callable[..., Any],
    body: dict[str, Any],
    read: Callable[[Events, OnText, str], Awaitable[dict[str, Any] | None]],
    on_text: OnText,
    from_wire: Callable[[dict[str, Any]], ModelResponse],
    whole: Callable[[], Awaitable[ModelResponse]] | None = None,
) -> ModelResponse:
    """`post`, streamed (ADR 0039): `create` is the endpoint's ``with_streaming_response
    .create``; `read` folds the events into the answer `from_wire` maps.

    `whole` asks the same request unstreamed. It is called, in the same attempt, when the
    stream ends or breaks before its first event (a timeout excepted): a server that fails a
    request after it has started its stream (llama-cpp-python's, for a request over its
    window: a 200, then nothing) says why only to a whole request, and its words decide the
    error's class (`ContextOverflow`, ADR 0065)."""

    closed: tuple[type[Exception], ...] = (*transport_errors(), openai.APIConnectionError)

    async def send() -> ModelResponse | None:
        seen = False

        async def events(lines: Any) -> Events:
            nonlocal seen
            async for event in sse_events(lines, PROVIDER):
                seen = True
                yield event

        try:
            async with create(**body) as raw:
                kind = raw.headers.get("content-type", "").split(";")[0].strip().lower()
                if kind == "application/json":  # a server that does not stream answers whole
                    return from_wire(decode_body(await raw.read()))
                if kind not in ("", "text/event-stream"):
                    start = (await raw.text())[:200]
                    raise ProviderError(
                        f"{PROVIDER}: a streamed request was answered with {kind[:80]}, not an "
                        f"event stream: {start!r}"
                    )
                answer = await read(events(raw.iter_lines()), on_text, PROVIDER)
        except closed as exc:
            if seen or whole is None or isinstance(exc, openai.APITimeoutError):
                raise
            answer = None  # closed before its first event; the SDK may call that a connection
        if answer is None and not seen and whole is not None:
            return await whole()
        return None if answer is None else from_wire(answer)

    return await attempt(
        lambda: cut_short(send, PROVIDER),
        foreign=openai.OpenAIError,
        to_error=map_error,
        secret=client.api_key,
    )


def tool_output_text(result: ToolResult) -> str:
    """The text a tool result is sent as; see `ERROR_MARKER`. Elided results already hold their
    pointer text in `content`, so nothing else changes here."""
    if result.is_error and not result.content.lstrip().lower().startswith("error"):
        return ERROR_MARKER + result.content
    return result.content


def _provider_message(exc: openai.APIError) -> str:
    """The provider's own words: the body's ``error.message`` when there is one.

    The SDK has already unwrapped ``{"error": {...}}`` into `exc.body`; compatible servers
    sometimes send ``{"error": "text"}`` or plain text instead, and those are used as they are.
    """
    body = exc.body
    if isinstance(body, Mapping):
        for key in ("message", "detail", "error"):  # OpenAI's, then FastAPI-style servers'
            message = body.get(key)
            if isinstance(message, str) and message:
                return message
    if isinstance(body, str) and body.strip():
        return body.strip()[:500]
    return exc.message


def _error_code(exc: openai.APIError) -> str | None:
    body = exc.body
    code = body.get("code") if isinstance(body, Mapping) else None
    return code if isinstance(code, str) else None


def map_error(
    exc: openai.OpenAIError, *, secret: str | None = None, now: float | None = None
) -> ProviderError:
    """One SDK exception as one ProviderError, classified for the gateway's retry decision.

    Statuses are classified by `keel.transports.policy.is_retryable` (an exhausted quota is a
    429 that fails at once; a request over the model's window is a `ContextOverflow`, by its
    ``context_length_exceeded`` code or a compatible server's words); timeouts and dropped
    connections are retryable; a response the SDK could not read, or any other SDK failure, is
    not. `secret` is scrubbed from the message.
    """
    if isinstance(exc, openai.APITimeoutError):
        return ProviderError(f"{PROVIDER}: the request timed out", retryable=True)
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__
        detail = f": {type(cause).__name__}: {cause}" if cause is not None else ""
        return ProviderError(
            scrub(f"OpenAI API: connection failed{detail}", secret), retryable=True
        )
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        message = f"OpenAI API error {status}: {_provider_message(exc)}"
        error = ProviderError(
            scrub(message, secret),
            status=status,
            retryable=is_retryable(status, _error_code(exc)),
            retry_after=parse_retry_after(exc.response.headers, now),
        )
        return as_overflow(error, exc.body)  # the code and llama.cpp's counts are in the body
    if isinstance(exc, openai.APIResponseValidationError):
        return ProviderError(
            f"OpenAI API: unreadable response ({exc.status_code})", status=exc.status_code
        )
    return ProviderError(scrub(f"OpenAI API: {type(exc).__name__}: {exc}", secret))


def decode_body(body: bytes | str) -> dict[str, Any]:
    """A successful response's JSON object (strict: see `keel.transports.wire.decode_json`)."""
    return decode_json(body, PROVIDER)
