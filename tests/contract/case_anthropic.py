"""The Anthropic Messages transport in the shared provider contract.

Response bodies follow real Messages API responses (ids, usage fields and error bodies as the
API returns them), with nothing secret in them.
"""

from __future__ import annotations

import itertools
import json
from typing import Any, ClassVar

import httpx

from keel.transports.anthropic import AnthropicTransport

from .harness import CALL_A, CALL_B, CONTROL, HISTORY, RESULT_A_TEXT, RESULT_B_TEXT, SYSTEM, TOOLS

BREAKPOINT = {"type": "ephemeral"}

MODEL = "claude-sonnet-4-6"
FAKE_KEY = "sk-ant-api03-contract-test-key-not-real"

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}
"""Error types from the API's error reference; other 5xx answers are ``api_error``."""


def _message(
    content: list[dict[str, Any]], stop_reason: str, usage: dict[str, Any]
) -> httpx.Response:
    body = {
        "id": "msg_01XFDUDYJgAACzvnptvVoYEL",
        "type": "message",
        "role": "assistant",
        "model": MODEL,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": usage,
    }
    headers = {"request-id": "req_011CSHoEeqs5C35K2UUqR7Fy", "anthropic-organization-id": "org"}
    return httpx.Response(200, json=body, headers=headers)


def _expected_messages() -> list[dict[str, Any]]:
    """The history of `harness.HISTORY` on the wire: user, assistant (text, two tool_use blocks),
    one user message holding both tool_result blocks; result A is the last settled item and
    result B the last item, so each ends in a cache breakpoint."""
    first, assistant = HISTORY[0], HISTORY[1]
    assert first.kind == "user" and assistant.kind == "assistant"
    return [
        {"role": "user", "content": [{"type": "text", "text": first.text}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": assistant.text},
                {"type": "tool_use", "id": CALL_A.id, "name": "fetch", "input": CALL_A.arguments},
                {
                    "type": "tool_use",
                    "id": CALL_B.id,
                    "name": "read_file",
                    "input": CALL_B.arguments,
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": CALL_A.id,
                    "content": RESULT_A_TEXT,
                    "cache_control": BREAKPOINT,
                },
                {
                    "type": "tool_result",
                    "tool_use_id": CALL_B.id,
                    "content": RESULT_B_TEXT,
                    "is_error": True,
                    "cache_control": BREAKPOINT,
                },
            ],
        },
    ]


class AnthropicCase:
    name = "anthropic"
    required_choice: ClassVar[dict[str, str]] = {"type": "any"}

    def make(self, http: httpx.AsyncClient) -> AnthropicTransport:
        return AnthropicTransport(MODEL, http_client=http, api_key=FAKE_KEY)

    def text_response(self) -> httpx.Response:
        return _message(
            [{"type": "text", "text": "The loop depends on the breaker."}],
            "end_turn",
            {
                "input_tokens": 100,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 20,
                "output_tokens": 9,
                "service_tier": "standard",
            },
        )

    def tool_calls_response(self) -> httpx.Response:
        return _message(
            [
                {"type": "text", "text": "I'll read both."},
                {
                    "type": "tool_use",
                    "id": "call_x1",
                    "name": "fetch",
                    "input": {"url": "https://example.org/a"},
                },
                {
                    "type": "tool_use",
                    "id": "call_x2",
                    "name": "read_file",
                    "input": {"path": "README.md"},
                },
            ],
            "tool_use",
            {
                "input_tokens": 512,
                "cache_creation_input_tokens": 1024,
                "cache_read_input_tokens": 0,
                "output_tokens": 88,
                "service_tier": "standard",
            },
        )

    def error_response(self, status: int) -> httpx.Response:
        kind = _ERROR_TYPES.get(status, "api_error")
        body = {"type": "error", "error": {"type": kind, "message": f"simulated failure {status}"}}
        headers = {"request-id": "req_011CSHoEeqs5C35K2UUqR7Fz"}
        if status == 429:
            headers["retry-after"] = "7"
        return httpx.Response(status, json=body, headers=headers)

    def _check_common(self, body: dict[str, Any]) -> None:
        assert body["model"] == MODEL
        assert body["max_tokens"] == 4096
        # The frozen prefix is cached: a breakpoint on the last tool and one on the system.
        assert body["system"] == [{"type": "text", "text": SYSTEM, "cache_control": BREAKPOINT}]
        tools = [
            {"name": t.name, "description": t.description, "input_schema": t.parameters}
            for t in TOOLS
        ]
        tools[-1]["cache_control"] = BREAKPOINT
        assert body["tools"] == tools
        assert json.dumps(body).count('"cache_control"') == 4  # Anthropic allows four at most
        roles = [m["role"] for m in body["messages"]]
        assert roles[0] == "user"
        assert all(a != b for a, b in itertools.pairwise(roles)), roles
        assert SYSTEM not in json.dumps(body["messages"])

    def check_ordinary(self, body: dict[str, Any]) -> None:
        self._check_common(body)
        assert set(body) == {"model", "max_tokens", "system", "tools", "messages"}
        assert "tool_choice" not in body
        assert body["messages"] == _expected_messages()
        assert CONTROL not in json.dumps(body)

    def check_synthesis(self, body: dict[str, Any]) -> None:
        self._check_common(body)
        assert set(body) == {"model", "max_tokens", "system", "tools", "messages", "tool_choice"}
        assert body["tool_choice"] == {"type": "none"}
        expected = _expected_messages()
        expected[-1]["content"].append({"type": "text", "text": CONTROL})
        assert body["messages"] == expected
        assert body["messages"][-1]["content"][-1] == {"type": "text", "text": CONTROL}
        assert json.dumps(body).count(json.dumps(CONTROL)) == 1
        # The control comes after the last breakpoint (the prompt's order: tools, system, then
        # the messages' blocks): never cached, never read from a cache.
        blocks = [b for m in body["messages"] for b in m["content"]]
        last = max(i for i, b in enumerate(blocks) if "cache_control" in b)
        assert blocks.index({"type": "text", "text": CONTROL}) > last


CASE = AnthropicCase()
