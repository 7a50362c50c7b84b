"""Contract case: the OpenAI Responses API (``POST /v1/responses``).

Response bodies follow what the API returns (field names, object types, id prefixes, usage
details, error envelopes); ids and encrypted content are made up, nothing is live.
"""

from __future__ import annotations

from typing import Any

import httpx

from keel.transports.openai_responses import OpenAIResponsesTransport

from .harness import CACHE_KEY, CONTROL, RESULT_A_TEXT, RESULT_B_TEXT, SYSTEM
from .openai_errors import openai_error_response

MODEL = "gpt-5"
SNAPSHOT = "gpt-5-2025-08-07"
FAKE_KEY = "sk-test-not-a-real-key-0000000000000000"
ENCRYPTED = "gAAAAABor0AxZmFrZS1lbmNyeXB0ZWQtcmVhc29uaW5nLWZvci10ZXN0cw=="

WIRE_TOOLS = [
    {
        "type": "function",
        "name": "fetch",
        "description": "Download a web page as text.",
        "parameters": {
            "type": "object",
            "properties": {"url": {"type": "string"}},
            "required": ["url"],
        },
        "strict": False,
    },
    {
        "type": "function",
        "name": "read_file",
        "description": "Read a file of the repository.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "start_line": {"type": "integer"}},
            "required": ["path"],
        },
        "strict": False,
    },
]

WIRE_HISTORY = [
    {"type": "message", "role": "user", "content": "Which modules does the run loop depend on?"},
    {"type": "message", "role": "assistant", "content": "Let me look."},
    {
        "type": "function_call",
        "call_id": "call_a1",
        "name": "fetch",
        "arguments": '{"url": "https://example.org/spec"}',
    },
    {
        "type": "function_call",
        "call_id": "call_b2",
        "name": "read_file",
        "arguments": '{"path": "src/keel/loop.py"}',
    },
    {"type": "function_call_output", "call_id": "call_a1", "output": RESULT_A_TEXT},
    # The Responses API has no error flag on a result: Keel marks the text instead.
    {"type": "function_call_output", "call_id": "call_b2", "output": "ERROR: " + RESULT_B_TEXT},
]


def _response(output: list[dict[str, Any]], usage: dict[str, Any]) -> httpx.Response:
    return httpx.Response(
        200,
        headers={
            "content-type": "application/json",
            "x-request-id": "req_3f1c7e2a9b5d4e8f8a6b0c2d4e6f8a0b",
            "openai-processing-ms": "1874",
        },
        json={
            "id": "resp_68af4030592c81938ec0a5fbab4a3e9f05438e46b5f69a3b",
            "object": "response",
            "created_at": 1756315696,
            "status": "completed",
            "background": False,
            "error": None,
            "incomplete_details": None,
            "instructions": SYSTEM,
            "max_output_tokens": None,
            "max_tool_calls": None,
            "model": SNAPSHOT,
            "output": output,
            "parallel_tool_calls": True,
            "previous_response_id": None,
            "prompt_cache_key": None,
            "reasoning": {"effort": "medium", "summary": None},
            "safety_identifier": None,
            "service_tier": "default",
            "store": False,
            "temperature": 1.0,
            "text": {"format": {"type": "text"}, "verbosity": "medium"},
            "tool_choice": "auto",
            "tools": WIRE_TOOLS,
            "top_logprobs": 0,
            "top_p": 1.0,
            "truncation": "disabled",
            "usage": usage,
            "user": None,
            "metadata": {},
        },
    )


class _Case:
    name = "openai_responses"
    required_choice = "required"

    def make(self, http: httpx.AsyncClient) -> OpenAIResponsesTransport:
        return OpenAIResponsesTransport(MODEL, http_client=http, api_key=FAKE_KEY)

    def text_response(self) -> httpx.Response:
        return _response(
            [
                {
                    "id": "msg_68af4033d1a8819388a8c2d7a6ad2f2505438e46b5f69a3b",
                    "type": "message",
                    "status": "completed",
                    "content": [
                        {
                            "type": "output_text",
                            "annotations": [],
                            "logprobs": [],
                            "text": "The loop depends on the breaker.",
                        }
                    ],
                    "role": "assistant",
                }
            ],
            {
                "input_tokens": 120,
                "input_tokens_details": {"cached_tokens": 20},
                "output_tokens": 9,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": 129,
            },
        )

    def tool_calls_response(self) -> httpx.Response:
        return _response(
            [
                {
                    "id": "rs_68af4031a1e08193b7c5d6e2f0a1b2c305438e46b5f69a3b",
                    "type": "reasoning",
                    "encrypted_content": ENCRYPTED,
                    "summary": [],
                },
                {
                    "id": "fc_68af4032b7c881939f1e2d3c4b5a697805438e46b5f69a3b",
                    "type": "function_call",
                    "status": "completed",
                    "arguments": '{"url":"https://example.org/a"}',
                    "call_id": "call_x1",
                    "name": "fetch",
                },
                {
                    "id": "fc_68af4032c3d48193a0b1c2d3e4f5061705438e46b5f69a3b",
                    "type": "function_call",
                    "status": "completed",
                    "arguments": '{"path":"README.md"}',
                    "call_id": "call_x2",
                    "name": "read_file",
                },
            ],
            {
                "input_tokens": 412,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": 118,
                "output_tokens_details": {"reasoning_tokens": 64},
                "total_tokens": 530,
            },
        )

    def error_response(self, status: int) -> httpx.Response:
        return openai_error_response(status, "req_9d8c7b6a5f4e3d2c")

    def check_ordinary(self, body: dict[str, Any]) -> None:
        assert set(body) == {"model", "instructions", "tools", "input", "store", "prompt_cache_key"}
        assert body["prompt_cache_key"] == CACHE_KEY  # one cache key per run
        assert "tool_choice" not in body  # None keeps the provider's default: no key at all
        assert body["model"] == MODEL
        assert body["instructions"] == SYSTEM
        assert body["tools"] == WIRE_TOOLS
        assert body["input"] == WIRE_HISTORY
        assert body["store"] is False
        assert CONTROL not in str(body)

    def check_synthesis(self, body: dict[str, Any]) -> None:
        assert set(body) == {
            "model",
            "instructions",
            "tools",
            "tool_choice",
            "input",
            "store",
            "prompt_cache_key",
        }
        assert body["prompt_cache_key"] == CACHE_KEY
        assert body["tool_choice"] == "none"
        assert body["model"] == MODEL
        assert body["instructions"] == SYSTEM
        assert body["tools"] == WIRE_TOOLS  # definitions stay so the history replays
        assert body["input"][:-1] == WIRE_HISTORY  # call/result pairs intact, ids paired
        assert body["input"][-1] == {"type": "message", "role": "user", "content": CONTROL}
        assert str(body).count(CONTROL) == 1
        assert body["store"] is False


CASE = _Case()
