"""Contract case: the XML fallback over Chat Completions (a text-only local model, say llama.cpp).

Nothing tool-shaped goes on the wire: the tools are in the system message, the calls come back
inside the answer's text, and prior calls and results replay as text.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from keel.transports.base import Transport
from keel.transports.openai_chat import OpenAIChatTransport
from keel.transports.xml_fallback import TOOL_INSTRUCTION, XmlFallbackTransport

from .harness import (
    CALL_A,
    CALL_B,
    CONTROL,
    RESULT_A_TEXT,
    RESULT_B_TEXT,
    SYSTEM,
    TOOLS,
)

MODEL = "qwen2.5-0.5b-instruct"
BASE_URL = "http://127.0.0.1:8080/v1"


def _completion(content: str, usage: dict[str, Any]) -> httpx.Response:
    """A chat.completion as llama.cpp's OpenAI-compatible server sends it."""
    return httpx.Response(
        200,
        json={
            "id": "chatcmpl-9x8TQ3kZbC2vLw",
            "object": "chat.completion",
            "created": 1727430000,
            "model": MODEL,
            "system_fingerprint": "b3821-6262d13e",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content, "refusal": None},
                    "logprobs": None,
                    "finish_reason": "stop",
                }
            ],
            "usage": usage,
        },
    )


class XmlOpenAIChatCase:
    name = "xml:openai-chat"
    required_choice = None
    """A text model cannot be made to call: the tools are described, nothing more is sent."""

    def make(self, http: httpx.AsyncClient) -> Transport:
        inner = OpenAIChatTransport(MODEL, http_client=http, base_url=BASE_URL)
        return XmlFallbackTransport(inner)

    def text_response(self) -> httpx.Response:
        return _completion(
            "The loop depends on the breaker.",
            {
                "prompt_tokens": 120,
                "completion_tokens": 9,
                "total_tokens": 129,
                "prompt_tokens_details": {"cached_tokens": 20, "audio_tokens": 0},
                "completion_tokens_details": {"reasoning_tokens": 0},
            },
        )

    def tool_calls_response(self) -> httpx.Response:
        content = (
            "I will fetch the page and read the README.\n"
            '<call name="fetch">{"url": "https://example.org/a"}</call>\n'
            '<call name="read_file">{"path": "README.md"}</call>'
        )
        return _completion(
            content, {"prompt_tokens": 412, "completion_tokens": 41, "total_tokens": 453}
        )

    def error_response(self, status: int) -> httpx.Response:
        kinds = {429: "rate_limit_exceeded", 401: "invalid_api_key", 404: "model_not_found"}
        body = {
            "error": {
                "message": f"simulated failure {status}",
                "type": "server_error" if status >= 500 else "invalid_request_error",
                "param": None,
                "code": kinds.get(status),
            }
        }
        headers = {"retry-after": "7"} if status == 429 else {}
        return httpx.Response(status, json=body, headers=headers)

    def check_ordinary(self, body: dict[str, Any]) -> None:
        _no_native_tools(body)
        messages = body["messages"]
        system = messages[0]
        assert system["role"] == "system"
        assert system["content"].startswith(SYSTEM + "\n\n")
        assert TOOL_INSTRUCTION in system["content"]
        for tool in TOOLS:
            assert f"- {tool.name}: {tool.description}" in system["content"]
            assert json.dumps(tool.parameters) in system["content"]
        _check_history(messages[1:])
        assert len(messages) == 4
        assert all(CONTROL not in json.dumps(m) for m in messages)

    def check_synthesis(self, body: dict[str, Any]) -> None:
        _no_native_tools(body)
        messages = body["messages"]
        assert messages[0] == {"role": "system", "content": SYSTEM}
        _check_history(messages[1:4])
        assert messages[4:] == [{"role": "user", "content": CONTROL}]
        for tool in TOOLS:  # not described anywhere: nothing invites a call
            assert json.dumps(tool.parameters) not in json.dumps(messages)


def _no_native_tools(body: dict[str, Any]) -> None:
    assert body["model"] == MODEL
    assert "tools" not in body
    assert "tool_choice" not in body
    assert "parallel_tool_calls" not in body
    assert "prompt_cache_key" not in body  # OpenAI's field; a local server may refuse it


def _check_history(messages: list[dict[str, Any]]) -> None:
    question, assistant, results = messages[:3]
    assert question == {"role": "user", "content": "Which modules does the run loop depend on?"}
    assert assistant["role"] == "assistant"
    assert "tool_calls" not in assistant
    assert assistant["content"] == (
        "Let me look.\n"
        f'<call name="fetch">{CALL_A.raw_arguments}</call>\n'
        f'<call name="read_file">{CALL_B.raw_arguments}</call>'
    )
    assert results["role"] == "user"
    assert results["content"] == (
        f'<result name="fetch" id="{CALL_A.id}">\n{RESULT_A_TEXT}\n</result>\n'
        f'<result name="read_file" id="{CALL_B.id}" error="true">\n{RESULT_B_TEXT}\n</result>'
    )
    assert all(m["role"] != "tool" for m in messages)


CASE = XmlOpenAIChatCase()
