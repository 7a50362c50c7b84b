"""Contract case: OpenAI Chat Completions (``POST /v1/chat/completions``).

Response bodies follow what the API returns (``chat.completion`` objects, ``chatcmpl-`` ids,
usage details, error envelopes); ids are made up, nothing is live.
"""

from __future__ import annotations

from typing import Any

import httpx

from keel.transports.openai_chat import OpenAIChatTransport

from .harness import CACHE_KEY, CONTROL, RESULT_A_TEXT, RESULT_B_TEXT, SYSTEM
from .openai_errors import openai_error_response

MODEL = "gpt-4.1"
SNAPSHOT = "gpt-4.1-2025-04-14"
FAKE_KEY = "sk-test-not-a-real-key-1111111111111111"

WIRE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "fetch",
            "description": "Download a web page as text.",
            "parameters": {
                "type": "object",
                "properties": {"url": {"type": "string"}},
                "required": ["url"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file of the repository.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "start_line": {"type": "integer"}},
                "required": ["path"],
            },
        },
    },
]

WIRE_MESSAGES = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": "Which modules does the run loop depend on?"},
    {
        "role": "assistant",
        "content": "Let me look.",
        "tool_calls": [
            {
                "id": "call_a1",
                "type": "function",
                "function": {"name": "fetch", "arguments": '{"url": "https://example.org/spec"}'},
            },
            {
                "id": "call_b2",
                "type": "function",
                "function": {"name": "read_file", "arguments": '{"path": "src/keel/loop.py"}'},
            },
        ],
    },
    {"role": "tool", "tool_call_id": "call_a1", "content": RESULT_A_TEXT},
    # Chat Completions has no error flag on a result: Keel marks the text instead.
    {"role": "tool", "tool_call_id": "call_b2", "content": "ERROR: " + RESULT_B_TEXT},
]


def _completion(
    message: dict[str, Any], finish_reason: str, usage: dict[str, Any]
) -> httpx.Response:
    return httpx.Response(
        200,
        headers={
            "content-type": "application/json",
            "x-request-id": "req_5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d",
            "openai-processing-ms": "642",
        },
        json={
            "id": "chatcmpl-C9xT2aQm0bFvZr8Lk3JpN4sYwHdE1",
            "object": "chat.completion",
            "created": 1756315696,
            "model": SNAPSHOT,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", **message, "refusal": None, "annotations": []},
                    "logprobs": None,
                    "finish_reason": finish_reason,
                }
            ],
            "usage": usage,
            "service_tier": "default",
            "system_fingerprint": "fp_b3f1157249",
        },
    )


def _usage(prompt: int, cached: int, completion: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


class _Case:
    name = "openai_chat"
    required_choice = "required"

    def make(self, http: httpx.AsyncClient) -> OpenAIChatTransport:
        return OpenAIChatTransport(MODEL, http_client=http, api_key=FAKE_KEY)

    def text_response(self) -> httpx.Response:
        return _completion(
            {"content": "The loop depends on the breaker."}, "stop", _usage(120, 20, 9)
        )

    def tool_calls_response(self) -> httpx.Response:
        return _completion(
            {
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_x1",
                        "type": "function",
                        "function": {
                            "name": "fetch",
                            "arguments": '{"url":"https://example.org/a"}',
                        },
                    },
                    {
                        "id": "call_x2",
                        "type": "function",
                        "function": {"name": "read_file", "arguments": '{"path":"README.md"}'},
                    },
                ],
            },
            "tool_calls",
            _usage(412, 0, 54),
        )

    def error_response(self, status: int) -> httpx.Response:
        return openai_error_response(status, "req_0e1d2c3b4a596877")

    def check_ordinary(self, body: dict[str, Any]) -> None:
        assert set(body) == {"model", "messages", "tools", "prompt_cache_key"}
        assert body["prompt_cache_key"] == CACHE_KEY  # one cache key per run, at OpenAI
        assert "tool_choice" not in body  # None keeps the provider's default: no key at all
        assert body["model"] == MODEL
        assert body["tools"] == WIRE_TOOLS
        assert body["messages"][0] == {"role": "system", "content": SYSTEM}
        assert body["messages"] == WIRE_MESSAGES
        assert CONTROL not in str(body)

    def check_synthesis(self, body: dict[str, Any]) -> None:
        assert set(body) == {"model", "messages", "tools", "tool_choice", "prompt_cache_key"}
        assert body["prompt_cache_key"] == CACHE_KEY
        assert body["tool_choice"] == "none"
        assert body["model"] == MODEL
        assert body["tools"] == WIRE_TOOLS  # definitions stay so the history replays
        assert body["messages"][:-1] == WIRE_MESSAGES  # call/result pairs intact, ids paired
        assert body["messages"][-1] == {"role": "user", "content": CONTROL}
        assert str(body).count(CONTROL) == 1


CASE = _Case()
