"""The shared provider contract for a request over the model's window (issue 44): every
transport raises a `ContextOverflow`, its own kind of ProviderError, never retried as it is,
with the provider's numbers when the provider says them.

The bodies are the providers' real error shapes (the wording each sends, the envelope and the
status), sent through the real SDKs over an `httpx.MockTransport`; the embedded model's is
llama-cpp-python's exception, raised where a generation would run, with no model loaded.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from keel.errors import ContextOverflow, ProviderError
from keel.transports.local import LocalTransport
from keel.transports.openai_chat import OpenAIChatTransport
from keel.transports.xml_fallback import XmlFallbackTransport

from . import case_anthropic, case_openai_chat, case_openai_responses
from .harness import Recorder, ordinary_request, synthesis_request

COMPATIBLE_SERVER = "http://127.0.0.1:8080/v1"


def _openai_error(message: str, param: str) -> httpx.Response:
    """OpenAI's 400 for a request over the window: the same envelope on both APIs."""
    body = {
        "message": message,
        "type": "invalid_request_error",
        "param": param,
        "code": "context_length_exceeded",
    }
    headers = {"content-type": "application/json", "x-request-id": "req_7f3e2d1c0b9a8877"}
    return httpx.Response(400, headers=headers, json={"error": body})


async def _refused(transport: Any) -> ContextOverflow:
    with pytest.raises(ProviderError) as info:
        await transport.request(ordinary_request())
    error = info.value
    assert isinstance(error, ContextOverflow), f"{type(error).__name__}: {error.message}"
    assert error.retryable is False
    return error


async def test_context_length_error_is_its_own_kind_openai_responses() -> None:
    wording = (
        "Your input exceeds the context window of this model. Please adjust your input and try "
        "again."
    )
    captured = Recorder(_openai_error(wording, "input"))
    error = await _refused(case_openai_responses.CASE.make(captured.http()))
    assert error.status == 400
    assert wording in error.message
    assert (error.requested, error.limit) == (None, None)  # the Responses API says no numbers
    assert len(captured.sent) == 1


async def test_context_length_error_is_its_own_kind_openai_chat() -> None:
    wording = (
        "This model's maximum context length is 128000 tokens. However, your messages resulted "
        "in 130532 tokens (129008 in the messages, 1524 in the functions). Please reduce the "
        "length of the messages or functions."
    )
    captured = Recorder(_openai_error(wording, "messages"))
    error = await _refused(case_openai_chat.CASE.make(captured.http()))
    assert error.status == 400
    assert "maximum context length is 128000 tokens" in error.message
    assert (error.requested, error.limit) == (130532, 128000)


@pytest.mark.parametrize(
    ("wording", "requested", "limit"),
    [
        ("prompt is too long: 208598 tokens > 200000 maximum", 208598, 200000),
        (
            "input length and `max_tokens` exceed context limit: 189136 + 20000 > 204648, "
            "decrease input length or `max_tokens` and try again",
            209136,
            204648,
        ),
    ],
    ids=["prompt-too-long", "input-plus-max-tokens"],
)
async def test_context_length_error_is_its_own_kind_anthropic(
    wording: str, requested: int, limit: int
) -> None:
    body = {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": wording},
        "request_id": "req_011CWdepJvA2D819tdYYq4h7",
    }
    headers = {"request-id": "req_011CWdepJvA2D819tdYYq4h7"}
    captured = Recorder(httpx.Response(400, json=body, headers=headers))
    error = await _refused(case_anthropic.CASE.make(captured.http()))
    assert error.status == 400
    assert wording in error.message
    assert (error.requested, error.limit) == (requested, limit)


async def test_context_length_error_is_its_own_kind_local_model() -> None:
    """llama-cpp-python's own words for a prompt over ``n_ctx`` (the transport raises the same
    when it counts the prompt first), mapped by the transport's real request path; the model
    is never loaded."""
    transport = LocalTransport(n_ctx=4096, max_tokens=256)

    def over_the_window(*args: object, **kwargs: object) -> object:
        raise ValueError("Requested tokens (5210) exceed context window of 4096")

    transport.generate = over_the_window  # type: ignore[method-assign]
    with pytest.raises(ProviderError) as info:
        await transport.request(synthesis_request())
    error = info.value
    assert isinstance(error, ContextOverflow)
    assert not error.retryable
    assert (error.requested, error.limit) == (5210, 4096)
    assert "context window of 4096" in error.message


COMPATIBLE_REFUSALS = {
    # vLLM's OpenAI-compatible server (a flat error object, the status in "code")
    "vllm": (
        400,
        {
            "object": "error",
            "message": "This model's maximum context length is 32768 tokens. However, you "
            "requested 35000 tokens (33000 in the messages, 2000 in the completion). Please "
            "reduce the length of the messages or completion.",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        },
        (35000, 32768),
    ),
    # llama.cpp's llama-server since its exceed_context_size_error type (counts in the body)
    "llama-server": (
        400,
        {
            "error": {
                "code": 400,
                "message": "the request exceeds the available context size, try increasing it",
                "type": "exceed_context_size_error",
                "n_prompt_tokens": 14429,
                "n_ctx": 8192,
            }
        },
        (14429, 8192),
    ),
    # the same from an older llama-server, which sent it as a 500 (retryable as a status)
    "llama-server-500": (
        500,
        {
            "error": {
                "code": 500,
                "message": "the request exceeds the available context size. try increasing "
                "the context size or enable context shift",
                "type": "exceed_context_size_error",
                "n_prompt_tokens": 1407,
                "n_ctx": 256,
            }
        },
        (1407, 256),
    ),
    # a LiteLLM proxy in front of Anthropic
    "litellm": (
        400,
        {
            "error": {
                "message": "litellm.ContextWindowExceededError: litellm.BadRequestError: "
                'AnthropicException - {"type":"error","error":{"type":"invalid_request_error",'
                '"message":"prompt is too long: 209303 tokens > 200000 maximum"}}\n'
                "Received Model Group=claude-sonnet\nAvailable Model Group Fallbacks=None",
                "type": None,
                "param": None,
                "code": "400",
            }
        },
        (209303, 200000),
    ),
}


@pytest.mark.parametrize("xml", [False, True], ids=["openai-chat", "xml:openai-chat"])
@pytest.mark.parametrize("server", sorted(COMPATIBLE_REFUSALS))
async def test_context_length_error_is_its_own_kind_openai_compatible_server(
    server: str, xml: bool
) -> None:
    status, body, numbers = COMPATIBLE_REFUSALS[server]
    captured = Recorder(httpx.Response(status, json=body))
    chat = OpenAIChatTransport(
        "qwen2.5-coder", http_client=captured.http(), base_url=COMPATIBLE_SERVER
    )
    error = await _refused(XmlFallbackTransport(chat) if xml else chat)
    assert error.status == status
    assert (error.requested, error.limit) == numbers
    assert len(captured.sent) == 1


async def test_an_ordinary_bad_request_is_not_an_overflow() -> None:
    """The same envelope with another message and code stays a plain ProviderError."""
    refusal = case_openai_chat.CASE.error_response(400)
    with pytest.raises(ProviderError) as info:
        await case_openai_chat.CASE.make(Recorder(refusal).http()).request(ordinary_request())
    assert not isinstance(info.value, ContextOverflow)


async def test_a_rate_limit_that_names_tokens_is_not_an_overflow() -> None:
    """OpenAI's "Request too large ... tokens per min" is a 429: a rate limit, retried."""
    body = {
        "message": "Request too large for gpt-4.1 in organization org-x on tokens per min "
        "(TPM): Limit 30000, Requested 52135. The input or output tokens must be reduced.",
        "type": "tokens",
        "param": None,
        "code": "rate_limit_exceeded",
    }
    refusal = httpx.Response(429, json={"error": body}, headers={"retry-after": "7"})
    with pytest.raises(ProviderError) as info:
        await case_openai_chat.CASE.make(Recorder(refusal).http()).request(ordinary_request())
    assert not isinstance(info.value, ContextOverflow)
    assert info.value.retryable
