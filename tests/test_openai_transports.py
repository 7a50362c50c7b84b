"""The two OpenAI transports beyond the shared contract: pure mappings, quirks, keys, errors.

Nothing goes live: pure functions get dicts shaped like the APIs' JSON, and the few end-to-end
checks run the real SDK over an ``httpx.MockTransport``.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from email.utils import format_datetime
from typing import Any, cast

import httpx
import openai
import pytest

from contract import case_openai_chat, case_openai_responses
from contract.harness import Recorder
from keel.errors import ConfigError, ProviderError
from keel.messages import (
    AssistantMessage,
    ModelRequest,
    ToolCall,
    ToolDefinition,
    ToolResult,
    UserMessage,
)
from keel.transports import openai_chat, openai_responses
from keel.transports._openai_common import LOCAL_PLACEHOLDER_KEY, map_error, resolve_api_key
from keel.transports.base import Transport
from keel.transports.openai_chat import OpenAIChatTransport
from keel.transports.openai_responses import PROVIDER_KEY, OpenAIResponsesTransport
from keel.transports.policy import parse_retry_after

KEY = "sk-proj-SECRET0123456789abcdefSECRET"
TOOL = ToolDefinition("fetch", "Fetch a page.", {"type": "object", "properties": {}})
CALL_1 = ToolCall.from_raw("call_1", "fetch", '{"url": "https://a.example"}')
CALL_2 = ToolCall.from_raw("call_2", "fetch", '{"url": "https://b.example"}')
ENCRYPTED = case_openai_responses.ENCRYPTED


def request(
    *items: Any,
    tools: tuple[ToolDefinition, ...] = (TOOL,),
    tool_choice: Any = None,
    volatile: tuple[str, ...] = (),
) -> ModelRequest:
    return ModelRequest("Be careful.", tools, items or (UserMessage("q"),), tool_choice, volatile)


def error(status: int, message: str, code: str | None = None, **headers: str) -> httpx.Response:
    body = {"error": {"message": message, "type": "x", "param": None, "code": code}}
    return httpx.Response(status, headers=headers, json=body)


@pytest.fixture(autouse=True)
def no_ambient_openai_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_ORG_ID", "OPENAI_PROJECT_ID"):
        monkeypatch.delenv(name, raising=False)


# --- names, clients, keys --------------------------------------------------------------------


def test_transports_are_named_and_satisfy_the_protocol() -> None:
    responses = OpenAIResponsesTransport("gpt-5", api_key=KEY)
    chat = OpenAIChatTransport("gpt-4.1", api_key=KEY)
    assert responses.name == "openai:gpt-5"
    assert chat.name == "openai-chat:gpt-4.1"
    assert isinstance(responses, Transport)
    assert isinstance(chat, Transport)


@pytest.mark.parametrize("make", [OpenAIResponsesTransport, OpenAIChatTransport])
def test_no_key_and_no_base_url_is_a_config_error(make: Any) -> None:
    with pytest.raises(ConfigError, match="set OPENAI_API_KEY"):
        make("m")


def test_key_comes_from_the_argument_then_the_environment_then_a_local_placeholder() -> None:
    assert resolve_api_key("sk-arg", None, {"OPENAI_API_KEY": "sk-env"}) == "sk-arg"
    assert resolve_api_key(None, None, {"OPENAI_API_KEY": "sk-env"}) == "sk-env"
    assert resolve_api_key(None, "http://127.0.0.1:8080/v1", {}) == LOCAL_PLACEHOLDER_KEY
    with pytest.raises(ConfigError):
        resolve_api_key(None, None, {})


async def test_environment_key_is_sent_as_bearer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    server = Recorder(case_openai_chat.CASE.text_response())
    await OpenAIChatTransport("gpt-4.1", http_client=server.http()).request(request())
    assert server.sent[0].headers["authorization"] == f"Bearer {KEY}"
    assert server.sent[0].url == "https://api.openai.com/v1/chat/completions"


async def test_local_server_needs_no_key_and_gets_max_tokens() -> None:
    server = Recorder(case_openai_chat.CASE.text_response())
    transport = OpenAIChatTransport(
        "qwen", http_client=server.http(), base_url="http://127.0.0.1:8080/v1", max_tokens=256
    )
    await transport.request(request())
    sent = server.sent[0]
    assert sent.url == "http://127.0.0.1:8080/v1/chat/completions"
    assert sent.headers["authorization"] == f"Bearer {LOCAL_PLACEHOLDER_KEY}"
    assert server.body()["max_tokens"] == 256
    assert "max_completion_tokens" not in server.body()


async def test_openai_itself_gets_max_completion_tokens() -> None:
    server = Recorder(case_openai_chat.CASE.text_response())
    transport = OpenAIChatTransport(
        "o4-mini", http_client=server.http(), api_key=KEY, max_tokens=256
    )
    await transport.request(request())
    assert server.body()["max_completion_tokens"] == 256
    assert "max_tokens" not in server.body()


async def test_chat_sends_the_runs_cache_key_to_openai_only() -> None:
    keyed = dataclasses.replace(request(), cache_key="run_0123")
    openai_server = Recorder(case_openai_chat.CASE.text_response())
    at_openai = OpenAIChatTransport("gpt-4.1", http_client=openai_server.http(), api_key=KEY)
    await at_openai.request(keyed)
    assert openai_server.body()["prompt_cache_key"] == "run_0123"
    local_server = Recorder(case_openai_chat.CASE.text_response())
    local = OpenAIChatTransport(
        "qwen", http_client=local_server.http(), base_url="http://127.0.0.1:8080/v1"
    )
    await local.request(keyed)
    assert "prompt_cache_key" not in local_server.body()  # strict servers refuse unknown fields
    assert "prompt_cache_key" not in openai_chat.to_wire(request(), model="m", send_cache_key=True)


async def test_responses_sends_max_output_tokens_to_the_responses_endpoint() -> None:
    server = Recorder(case_openai_responses.CASE.text_response())
    transport = OpenAIResponsesTransport(
        "gpt-5", http_client=server.http(), api_key=KEY, max_output_tokens=900
    )
    await transport.request(request())
    assert server.sent[0].url == "https://api.openai.com/v1/responses"
    assert server.body()["max_output_tokens"] == 900


@pytest.mark.parametrize("make", [OpenAIResponsesTransport, OpenAIChatTransport])
async def test_the_sdk_never_retries_even_on_a_callers_client(make: Any) -> None:
    server = Recorder(error(500, "boom"), error(500, "boom"), error(500, "boom"))
    # The SDK types http_client as its own httpx2 client; it accepts httpx's at run time.
    sdk = openai.AsyncOpenAI(api_key=KEY, http_client=cast(Any, server.http()), max_retries=5)
    with pytest.raises(ProviderError) as info:
        await make("m", client=sdk).request(request())
    assert info.value.retryable
    assert len(server.sent) == 1
    assert server.sent[0].headers["x-stainless-retry-count"] == "0"


def test_client_and_client_parts_together_are_a_config_error() -> None:
    sdk = openai.AsyncOpenAI(api_key=KEY)
    with pytest.raises(ConfigError, match="either client"):
        OpenAIChatTransport("m", client=sdk, api_key=KEY)


# --- requests: Responses ---------------------------------------------------------------------


def test_responses_assistant_turn_with_text_and_calls_replays_text_then_calls() -> None:
    turn = AssistantMessage("Two pages to read.", (CALL_1, CALL_2))
    body = openai_responses.to_wire(request(UserMessage("q"), turn), model="m")
    assert body["input"][1:] == [
        {"type": "message", "role": "assistant", "content": "Two pages to read."},
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "fetch",
            "arguments": '{"url": "https://a.example"}',
        },
        {
            "type": "function_call",
            "call_id": "call_2",
            "name": "fetch",
            "arguments": '{"url": "https://b.example"}',
        },
    ]


def test_responses_without_tools_sends_neither_tools_nor_tool_choice() -> None:
    body = openai_responses.to_wire(request(tools=(), tool_choice="none"), model="m")
    assert "tools" not in body
    assert "tool_choice" not in body
    assert body["store"] is False


def test_responses_several_controls_go_last_in_order() -> None:
    body = openai_responses.to_wire(request(volatile=("first", "second")), model="m")
    assert body["input"][-2:] == [
        {"type": "message", "role": "user", "content": "first"},
        {"type": "message", "role": "user", "content": "second"},
    ]


async def test_responses_reasoning_items_round_trip_through_provider_details() -> None:
    case = case_openai_responses.CASE
    server = Recorder(case.tool_calls_response(), case.text_response())
    transport = case.make(server.http())
    first = await transport.request(request())
    layout = first.provider_details[PROVIDER_KEY]["output"]
    assert [entry["type"] for entry in layout] == ["reasoning", "function_call", "function_call"]
    json.dumps(first.provider_details)  # plain JSON, so a store can keep it

    turn = AssistantMessage(first.text, first.tool_calls, first.provider_details)
    results = [ToolResult(c.id, c.name, c.key, "ok") for c in first.tool_calls]
    await transport.request(request(UserMessage("q"), turn, *results))
    replay = server.body()["input"][1:]
    assert replay[0]["type"] == "reasoning"
    assert replay[0]["encrypted_content"] == ENCRYPTED
    assert replay[0]["id"].startswith("rs_")
    assert [(i["type"], i.get("call_id")) for i in replay[1:]] == [
        ("function_call", "call_x1"),
        ("function_call", "call_x2"),
        ("function_call_output", "call_x1"),
        ("function_call_output", "call_x2"),
    ]
    assert all("id" not in item for item in replay[1:])  # store=false: ids would not resolve


def test_responses_replay_keeps_interleaved_order_and_phase_and_drops_bare_reasoning() -> None:
    details = {
        PROVIDER_KEY: {
            "output": [
                {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "enc-1"},
                {"type": "message", "phase": "commentary"},
                {"type": "function_call", "call_id": "call_1"},
                {"type": "reasoning", "id": "rs_2", "summary": []},  # no encrypted content: a 404
                {"type": "reasoning", "id": "rs_3", "summary": [], "encrypted_content": "enc-3"},
                {"type": "function_call", "call_id": "call_2"},
            ]
        }
    }
    turn = AssistantMessage("Reading both.", (CALL_1, CALL_2), details)
    items = openai_responses.to_wire(request(turn), model="m")["input"]
    assert [(i["type"], i.get("id") or i.get("call_id") or i.get("phase")) for i in items] == [
        ("reasoning", "rs_1"),
        ("message", "commentary"),
        ("function_call", "call_1"),
        ("reasoning", "rs_3"),
        ("function_call", "call_2"),
    ]


def test_responses_parses_phase_refusal_incomplete_and_missing_usage() -> None:
    data = {
        "status": "incomplete",
        "incomplete_details": {"reason": "max_output_tokens"},
        "output": [
            {
                "type": "message",
                "phase": "final_answer",
                "content": [{"type": "refusal", "refusal": "I can't help with that."}],
            }
        ],
    }
    response = openai_responses.from_wire(data)
    assert response.text == "I can't help with that."
    assert response.stop_reason == "max_output_tokens"
    assert response.usage.total == 0
    assert response.provider_details[PROVIDER_KEY]["output"] == [
        {"type": "message", "phase": "final_answer"}
    ]


@pytest.mark.parametrize(("code", "retryable"), [("server_error", True), ("invalid_prompt", False)])
def test_responses_failed_status_is_a_provider_error(code: str, retryable: bool) -> None:
    data = {"status": "failed", "error": {"code": code, "message": "it broke"}, "output": []}
    with pytest.raises(ProviderError, match="it broke") as info:
        openai_responses.from_wire(data)
    assert info.value.retryable is retryable


# --- requests: Chat Completions --------------------------------------------------------------


def test_chat_assistant_turn_with_text_and_calls_sends_both_and_empty_text_without_text() -> None:
    """"" and not null: llama-cpp-python's server answers 500 to null (ADR 0035)."""
    messages = openai_chat.to_wire(
        request(AssistantMessage("Reading.", (CALL_1,)), AssistantMessage(None, (CALL_2,))),
        model="m",
    )["messages"]
    assert messages[1]["content"] == "Reading."
    assert [c["id"] for c in messages[1]["tool_calls"]] == ["call_1"]
    assert messages[2]["content"] == ""
    assert messages[2]["tool_calls"][0] == {
        "id": "call_2",
        "type": "function",
        "function": {"name": "fetch", "arguments": '{"url": "https://b.example"}'},
    }


@pytest.mark.parametrize("tool_choice", [None, "none"])
async def test_chat_without_tools_sends_neither_tools_nor_tool_choice(tool_choice: Any) -> None:
    server = Recorder(case_openai_chat.CASE.text_response())
    transport = OpenAIChatTransport("m", http_client=server.http(), base_url="http://h/v1")
    await transport.request(request(tools=(), tool_choice=tool_choice, volatile=("answer now",)))
    body = server.body()
    assert set(body) == {"model", "messages", "stream", "stream_options"}  # streamed: ADR 0065
    assert body["messages"][-1] == {"role": "user", "content": "answer now"}


def test_chat_several_controls_go_last_in_order() -> None:
    result = ToolResult("call_1", "fetch", CALL_1.key, "page")
    messages = openai_chat.to_wire(
        request(AssistantMessage(None, (CALL_1,)), result, volatile=("first", "second")),
        model="m",
    )["messages"]
    assert messages[-3]["role"] == "tool"
    assert messages[-2:] == [
        {"role": "user", "content": "first"},
        {"role": "user", "content": "second"},
    ]


def test_error_results_are_marked_once_and_elided_pointers_pass_as_they_are() -> None:
    plain = ToolResult("call_1", "fetch", CALL_1.key, "404 page", is_error=True)
    worded = ToolResult("call_2", "fetch", CALL_2.key, "Error: timed out", is_error=True)
    pointer = ToolResult(
        "call_3", "fetch", CALL_1.key, "[elided to save context: ...]", elided=True
    )
    messages = openai_chat.to_wire(request(plain, worded, pointer), model="m")["messages"]
    assert [m["content"] for m in messages[1:]] == [
        "ERROR: 404 page",
        "Error: timed out",
        "[elided to save context: ...]",
    ]
    items = openai_responses.to_wire(request(plain, worded), model="m")["input"]
    assert [i["output"] for i in items] == ["ERROR: 404 page", "Error: timed out"]


# --- responses: Chat Completions from compatible servers -------------------------------------


def test_chat_compatible_server_without_usage_ids_or_string_arguments() -> None:
    data = {  # the looser shape some local servers send
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"function": {"name": "fetch", "arguments": {"url": "https://a.example"}}},
                        {
                            "id": "",
                            "type": "function",
                            "function": {
                                "name": "fetch",
                                "arguments": '{"url":"https://b.example"}',
                            },
                        },
                    ],
                },
            }
        ],
    }
    ids = iter(["call_made_1", "call_made_2"])
    response = openai_chat.from_wire(data, new_id=lambda: next(ids))
    assert [c.id for c in response.tool_calls] == ["call_made_1", "call_made_2"]
    assert response.tool_calls[0].arguments == {"url": "https://a.example"}
    assert response.usage.total == 0
    assert response.stop_reason == "tool_calls"


def test_chat_usage_without_details_counts_no_cached_tokens() -> None:
    usage = openai_chat.usage({"prompt_tokens": 50, "completion_tokens": 7, "total_tokens": 57})
    assert (usage.input_tokens, usage.output_tokens, usage.cached_input_tokens) == (50, 7, 0)
    assert (
        openai_chat.usage(
            {"prompt_tokens": 5, "completion_tokens": 1, "prompt_tokens_details": None}
        ).cached_input_tokens
        == 0
    )


def test_chat_text_parts_and_refusals() -> None:
    parts = {
        "choices": [
            {"message": {"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}}
        ]
    }
    assert openai_chat.from_wire(parts).text == "ab"
    refusal = {"choices": [{"message": {"content": None, "refusal": "No."}}]}
    assert openai_chat.from_wire(refusal).text == "No."
    assert openai_chat.from_wire({"choices": []}).is_empty


@pytest.mark.parametrize(
    ("stream", "says"),
    [("when-watched", "not a JSON object"), ("always", "text/plain, not an event stream")],
)
async def test_a_200_that_is_not_json_fails_at_once(stream: Any, says: str) -> None:
    server = Recorder(httpx.Response(200, text="<html>web ui</html>"))
    transport = OpenAIChatTransport(
        "m", http_client=server.http(), base_url="http://h/v1", stream=stream
    )
    with pytest.raises(ProviderError, match=says) as info:
        await transport.request(request())
    assert not info.value.retryable


# --- errors ----------------------------------------------------------------------------------


def test_retry_after_as_an_http_date() -> None:
    now = datetime(2026, 9, 27, 12, 0, 0, tzinfo=UTC).timestamp()
    later = format_datetime(datetime(2026, 9, 27, 12, 0, 30, tzinfo=UTC), usegmt=True)
    assert parse_retry_after({"retry-after": later}, now=now) == 30
    assert parse_retry_after({"retry-after": later}, now=now + 60) == 0  # past: no wait


def test_retry_after_prefers_milliseconds_and_ignores_nonsense() -> None:
    assert parse_retry_after({"retry-after-ms": "1500", "retry-after": "7"}) == 1.5
    assert parse_retry_after({"retry-after-ms": "soon", "retry-after": "7"}) == 7
    assert parse_retry_after({"retry-after": "whenever"}) is None
    assert parse_retry_after({}) is None


async def test_retry_after_date_reaches_the_provider_error() -> None:
    later = format_datetime(datetime(2100, 1, 1, tzinfo=UTC), usegmt=True)
    server = Recorder(error(503, "overloaded", **{"retry-after": later}))
    transport = OpenAIChatTransport("m", http_client=server.http(), api_key=KEY)
    with pytest.raises(ProviderError) as info:
        await transport.request(request())
    assert info.value.retry_after is not None and info.value.retry_after > 3600


@pytest.mark.parametrize(
    ("status", "code", "retryable"),
    [
        (408, None, True),
        (409, None, True),
        (422, None, False),
        (502, None, True),
        (429, "insufficient_quota", False),
        (400, "context_length_exceeded", False),
    ],
)
async def test_statuses_beyond_the_contract_are_classified(
    status: int, code: str | None, retryable: bool
) -> None:
    server = Recorder(error(status, f"failure {status}", code))
    transport = OpenAIResponsesTransport("m", http_client=server.http(), api_key=KEY)
    with pytest.raises(ProviderError) as info:
        await transport.request(request())
    assert (info.value.status, info.value.retryable) == (status, retryable)
    assert f"failure {status}" in info.value.message


@pytest.mark.parametrize("make", [OpenAIResponsesTransport, OpenAIChatTransport])
async def test_the_api_key_never_reaches_an_error_message(make: Any) -> None:
    echoed = f"Incorrect API key provided: {KEY}. You can find your API key elsewhere."
    server = Recorder(error(401, echoed, "invalid_api_key"))
    with pytest.raises(ProviderError) as info:
        await make("m", http_client=server.http(), api_key=KEY).request(request())
    error_ = info.value
    assert error_.status == 401 and not error_.retryable
    assert "Incorrect API key provided" in error_.message
    for text in (error_.message, str(error_), repr(error_)):
        assert KEY not in text


async def test_plain_text_error_bodies_from_compatible_servers_are_the_message() -> None:
    server = Recorder(httpx.Response(502, text="upstream llama-server is loading the model"))
    transport = OpenAIChatTransport("m", http_client=server.http(), base_url="http://h/v1")
    with pytest.raises(ProviderError, match="loading the model") as info:
        await transport.request(request())
    assert info.value.retryable


def test_unknown_sdk_errors_fail_at_once() -> None:
    mapped = map_error(openai.OpenAIError(f"odd state with {KEY}"), secret=KEY)
    assert not mapped.retryable
    assert KEY not in mapped.message
