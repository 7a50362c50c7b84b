"""What the two OpenAI transports share: the SDK client, the API key, and error mapping.

The SDK is used for what it is good at (authentication, base URLs, headers, turning HTTP
failures into typed exceptions) and kept away from what Keel owns: the SDK client is always
built with ``max_retries=0``, because the gateway decides about retries, backoff and deadlines
and a hidden second layer of retries would spend budget the run cannot see.

Foreign exceptions are mapped once, here, by `map_error`; the transports call it at their
boundary and nothing else in Keel ever sees an ``openai`` exception. The API key is used to
build the client and to scrub error messages, and is never logged, stored or put in a message.
"""

from __future__ import annotations

import datetime
import email.utils
import json
import os
import time
from collections.abc import Mapping
from typing import Any, cast

import httpx
import openai

from keel.errors import ConfigError, ProviderError
from keel.messages import ToolResult

LOCAL_PLACEHOLDER_KEY = "keel-no-key"
"""Sent to an explicit `base_url` when no key is configured: local servers (llama.cpp, vLLM)
ignore the Authorization header, but the SDK insists on having one."""

ERROR_MARKER = "ERROR: "
"""OpenAI's wire formats have no error flag on a tool result, so an error result is marked in
its text. Results that already start with "error" (Keel's own error texts do) are left alone."""

RETRYABLE_STATUSES = frozenset({408, 409, 429})
"""Besides 5xx: timeouts, conflicts (OpenAI uses 409 for transient locking) and rate limits."""

NOT_RETRYABLE_CODES = frozenset({"insufficient_quota"})
"""429s that no wait will fix: an exhausted billing quota fails at once instead of backing off."""


def resolve_api_key(
    api_key: str | None, base_url: str | None, env: Mapping[str, str] | None = None
) -> str:
    """The key to send: the argument, else OPENAI_API_KEY, else a placeholder for a local server.

    Without a key and without a `base_url` the request could only fail with a 401 after a round
    trip, so it is refused up front with a message that says what to set.
    """
    env = os.environ if env is None else env
    key = api_key or env.get("OPENAI_API_KEY")
    if key:
        return key
    if base_url:
        return LOCAL_PLACEHOLDER_KEY
    raise ConfigError(
        "set OPENAI_API_KEY (or pass api_key=...) to use the OpenAI API, or pass base_url=... "
        "to use a compatible server that needs no key"
    )


def build_client(
    *,
    client: openai.AsyncOpenAI | None,
    http_client: httpx.AsyncClient | None,
    base_url: str | None,
    api_key: str | None,
) -> openai.AsyncOpenAI:
    """The SDK client a transport talks through, never retrying on its own.

    A caller's own client is copied with retries off (the copy shares its connection pool).
    `http_client` is the injection point for tests (an ``httpx.MockTransport``) and for
    proxies; the SDK accepts a plain ``httpx.AsyncClient`` beside its own ``httpx2`` one.
    """
    if client is not None:
        if http_client is not None or base_url is not None or api_key is not None:
            raise ConfigError("pass either client=... or http_client/base_url/api_key, not both")
        return client.with_options(max_retries=0)
    base_url = base_url or os.environ.get("OPENAI_BASE_URL") or None
    return openai.AsyncOpenAI(
        api_key=resolve_api_key(api_key, base_url),
        base_url=base_url,
        # The SDK types this as its httpx2 client; at run time it accepts httpx's too.
        http_client=cast(Any, http_client),
        max_retries=0,
    )


def tool_output_text(result: ToolResult) -> str:
    """The text a tool result is sent as; see `ERROR_MARKER`. Elided results already hold their
    pointer text in `content`, so nothing else changes here."""
    if result.is_error and not result.content.lstrip().lower().startswith("error"):
        return ERROR_MARKER + result.content
    return result.content


def parse_retry_after(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """Seconds the provider asks us to wait: ``retry-after-ms``, else ``retry-after`` as seconds
    or as an HTTP date. None when absent or unreadable; never negative."""
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) / scale
        except ValueError:
            continue
        if seconds == seconds and seconds != float("inf"):  # not NaN, not infinite
            return max(0.0, seconds)
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # an HTTP date is GMT by definition
        when = when.replace(tzinfo=datetime.UTC)
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


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


def _scrub(text: str, secret: str | None) -> str:
    """Some compatible servers echo the key they rejected; it must not reach a message."""
    if secret and len(secret) >= 4:
        return text.replace(secret, "[redacted]")
    return text


def map_error(
    exc: openai.OpenAIError, *, secret: str | None = None, now: float | None = None
) -> ProviderError:
    """One SDK exception as one ProviderError, classified for the gateway's retry decision.

    Retryable: 408, 409, 429 (unless the quota is exhausted), 5xx, timeouts and dropped
    connections. Everything else (400 including context-length errors, 401, 403, 404, 422, a
    response the SDK could not read) fails at once. `secret` is scrubbed from the message.
    """
    if isinstance(exc, openai.APITimeoutError):
        return ProviderError("OpenAI API: the request timed out", retryable=True)
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__
        detail = f": {type(cause).__name__}: {cause}" if cause is not None else ""
        return ProviderError(
            _scrub(f"OpenAI API: connection failed{detail}", secret), retryable=True
        )
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        retryable = (status in RETRYABLE_STATUSES or status >= 500) and (
            _error_code(exc) not in NOT_RETRYABLE_CODES
        )
        message = f"OpenAI API error {status}: {_provider_message(exc)}"
        return ProviderError(
            _scrub(message, secret),
            status=status,
            retryable=retryable,
            retry_after=parse_retry_after(exc.response.headers, now),
        )
    if isinstance(exc, openai.APIResponseValidationError):
        return ProviderError(
            f"OpenAI API: unreadable response ({exc.status_code})", status=exc.status_code
        )
    return ProviderError(_scrub(f"OpenAI API: {type(exc).__name__}: {exc}", secret))


def decode_body(text: str) -> dict[str, Any]:
    """A successful response's JSON object. A 200 that is not JSON (a proxy's or a web UI's
    page at a wrong `base_url`) is not fixed by waiting, so it fails at once."""
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise ProviderError(f"OpenAI API: the response is not a JSON object: {text[:200]!r}")
    return data
