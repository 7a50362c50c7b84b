"""No error path of any keyed transport lets the API key out (docs/design.md, "The rules of a run":
boundaries).

Each transport runs through its real SDK over an ``httpx.MockTransport`` whose server echoes the
key back in every way a misbehaving server or proxy might: in the error body, in a response
header, in a plain-text page and in the text of a dropped connection. The ProviderError that
comes out is then searched everywhere a person or a log could see it: its text, its repr, the
traceback Python would print, and every exception chained to it (``__cause__`` and
``__context__``) with the headers of any request or response such an exception holds. The SDK
exceptions hold the outgoing request, and its headers hold the key, so the rule is that none of
them is chained at all.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from keel.errors import ProviderError
from keel.messages import ModelRequest, ToolDefinition, UserMessage
from keel.transports.anthropic import AnthropicTransport
from keel.transports.base import Transport
from keel.transports.openai_chat import OpenAIChatTransport
from keel.transports.openai_responses import OpenAIResponsesTransport
from keel.transports.xml_fallback import XmlFallbackTransport

OPENAI_KEY = "sk-proj-Vq3xT9Lm2Rk8Wz4Np6Bd1Hs5Jf7Gc0Ya2Ue4Io6Pl8KnT3BlbkFJx9q"
ANTHROPIC_KEY = "sk-ant-api03-Zr8Qm2Lx6Tv0Wn4Pk7Hd3Js9Fb1Gc5Ya-Ue2Io6Pl8KnAA"
TOOL = ToolDefinition("fetch", "Fetch a page.", {"type": "object", "properties": {}})
REQUEST = ModelRequest("Be careful.", (TOOL,), (UserMessage("What changed?"),))

Failure = Callable[[str, str], httpx.Response]
"""(vendor, key) -> what the server answers; it may raise an httpx error instead."""


def _body(vendor: str, kind: str, message: str) -> dict[str, Any]:
    if vendor == "anthropic":
        return {"type": "error", "error": {"type": kind, "message": message}}
    return {"error": {"message": message, "type": kind, "param": None, "code": kind}}


def unauthorized(vendor: str, key: str) -> httpx.Response:
    message = f"Incorrect API key provided: {key}. Check your key."
    return httpx.Response(
        401, json=_body(vendor, "invalid_api_key", message), headers={"x-echo-key": key}
    )


def rate_limited(vendor: str, key: str) -> httpx.Response:
    return httpx.Response(
        429,
        json=_body(vendor, "rate_limit_exceeded", f"slow down, {key}"),
        headers={"retry-after": "3", "x-echo-key": key},
    )


def overloaded(vendor: str, key: str) -> httpx.Response:
    return httpx.Response(529, json=_body(vendor, "overloaded_error", f"busy ({key})"))


def proxy_page(vendor: str, key: str) -> httpx.Response:
    return httpx.Response(502, text=f"<html>bad gateway for Bearer {key}</html>")


def not_json_200(vendor: str, key: str) -> httpx.Response:
    return httpx.Response(
        200, text=f"<html>login page, key {key}</html>", headers={"content-type": "text/html"}
    )


def dropped(vendor: str, key: str) -> httpx.Response:
    raise httpx.ConnectError(f"connection reset while sending Authorization: Bearer {key}")


def timed_out(vendor: str, key: str) -> httpx.Response:
    raise httpx.ReadTimeout(f"read timed out (x-api-key: {key})")


FAILURES = [unauthorized, rate_limited, overloaded, proxy_page, not_json_200, dropped, timed_out]


def _openai_responses(http: httpx.AsyncClient) -> Transport:
    return OpenAIResponsesTransport("gpt-5", http_client=http, api_key=OPENAI_KEY)


def _openai_chat(http: httpx.AsyncClient) -> Transport:
    return OpenAIChatTransport("gpt-4.1", http_client=http, api_key=OPENAI_KEY)


def _anthropic(http: httpx.AsyncClient) -> Transport:
    return AnthropicTransport("claude-sonnet-4-6", http_client=http, api_key=ANTHROPIC_KEY)


def _xml_over_chat(http: httpx.AsyncClient) -> Transport:
    return XmlFallbackTransport(_openai_chat(http))


TRANSPORTS = {
    "openai_responses": ("openai", OPENAI_KEY, _openai_responses),
    "openai_chat": ("openai", OPENAI_KEY, _openai_chat),
    "anthropic": ("anthropic", ANTHROPIC_KEY, _anthropic),
    "xml_over_openai_chat": ("openai", OPENAI_KEY, _xml_over_chat),
}


def chained(error: BaseException) -> Iterator[BaseException]:
    """`error` and every exception reachable from it through ``__cause__`` / ``__context__``."""
    seen: set[int] = set()
    todo = [error]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        todo += [e for e in (current.__cause__, current.__context__) if e is not None]


def visible_texts(error: BaseException) -> Iterator[str]:
    """Everything a traceback, a log line or a debugger could show of `error` and its chain."""
    yield "".join(traceback.format_exception(error))
    for exc in chained(error):
        yield str(exc)
        yield repr(exc)
        for name in ("request", "response"):
            try:
                held = getattr(exc, name, None)
            except Exception:  # httpx raises when an exception has no request attached
                continue
            headers = getattr(held, "headers", None)
            if headers is not None:
                yield " ".join(f"{k}: {v}" for k, v in headers.items())


async def failing_request(make: Callable[[httpx.AsyncClient], Transport], answer: Any) -> Any:
    http = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    with pytest.raises(ProviderError) as info:
        await make(http).request(REQUEST)
    return info.value


@pytest.mark.parametrize("failure", FAILURES, ids=[f.__name__ for f in FAILURES])
@pytest.mark.parametrize("transport", list(TRANSPORTS))
async def test_no_error_path_shows_the_api_key(transport: str, failure: Failure) -> None:
    vendor, key, make = TRANSPORTS[transport]
    error = await failing_request(make, lambda request: failure(vendor, key))
    for text in visible_texts(error):
        assert key not in text


@pytest.mark.parametrize("failure", FAILURES, ids=[f.__name__ for f in FAILURES])
@pytest.mark.parametrize("transport", list(TRANSPORTS))
async def test_a_provider_error_chains_no_sdk_exception(transport: str, failure: Failure) -> None:
    """The rule behind the test above: an SDK exception holds the request and its headers hold
    the key, so it is never attached, not even as a hidden ``__context__``."""
    vendor, key, make = TRANSPORTS[transport]
    error = await failing_request(make, lambda request: failure(vendor, key))
    assert [type(e).__name__ for e in chained(error)] == ["ProviderError"]
