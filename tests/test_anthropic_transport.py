"""The Anthropic Messages transport: the pure mappings, and the shell through the real SDK.

The shared contract (tests/contract) covers the ordinary and synthesis payloads, text and tool
call responses and the common error statuses; these tests cover the rest. Nothing goes live:
the SDK runs over an `httpx.MockTransport` answering with real response shapes.
"""

from __future__ import annotations

import gzip
import itertools
import json
import time
from email.utils import formatdate
from typing import Any

import anthropic
import httpx
import httpx2
import pytest
from hypothesis import given
from hypothesis import strategies as st

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
from keel.transports.anthropic import (
    THINKING_KEY,
    AnthropicTransport,
    from_wire,
    map_usage,
    to_wire,
)
from keel.transports.base import Transport
from keel.transports.policy import parse_retry_after

MODEL = "claude-sonnet-4-6"
KEY = "sk-ant-api03-unit-test-secret-0123456789"
TOOL = ToolDefinition("fetch", "Download a page.", {"type": "object", "properties": {}})
FETCH = ToolCall.from_raw("toolu_01A", "fetch", '{"url": "https://example.org"}')
BROKEN = ToolCall.from_raw("toolu_01B", "fetch", '{"url": "https://exa')
THINKING = {
    "type": "thinking",
    "thinking": "The spec page should name the modules.",
    "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds+opaque==",
}
REDACTED = {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT+opaque"}


def wire(
    *items: Any,
    tool_choice: Any = None,
    volatile: tuple[str, ...] = (),
    tools: tuple[ToolDefinition, ...] = (TOOL,),
) -> dict[str, Any]:
    """The body without its cache breakpoints (tested on their own below)."""
    request = ModelRequest("sys", tools, items, tool_choice=tool_choice, volatile=volatile)
    return without_breakpoints(to_wire(request, model=MODEL, max_tokens=1024))


def without_breakpoints(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: without_breakpoints(v) for k, v in data.items() if k != "cache_control"}
    if isinstance(data, list):
        return [without_breakpoints(v) for v in data]
    return data


def breakpoints(body: dict[str, Any]) -> list[str]:
    """Where the body's cache breakpoints are, in prompt order (tools, system, messages)."""
    found = [f"tool {t['name']}" for t in body.get("tools", ()) if "cache_control" in t]
    found += ["system" for b in body.get("system", ()) if "cache_control" in b]
    for m, message in enumerate(body["messages"]):
        for b, block in enumerate(message["content"]):
            if "cache_control" in block:
                assert block["cache_control"] == {"type": "ephemeral"}
                found.append(f"message {m} block {b}")
    return found


def result(call: ToolCall, content: str, *, is_error: bool = False) -> ToolResult:
    return ToolResult(call.id, call.name, call.key, content, is_error=is_error)


def message_body(content: list[dict[str, Any]], **usage: Any) -> dict[str, Any]:
    return {
        "id": "msg_01Aq9w938a90dw8q",
        "type": "message",
        "role": "assistant",
        "model": MODEL,
        "content": content,
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": usage or {"input_tokens": 10, "output_tokens": 5},
    }


def error_body(kind: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}


class Server(Recorder):
    """The fake provider, with the Anthropic transport built on it."""

    def transport(self, **options: Any) -> AnthropicTransport:
        return AnthropicTransport(MODEL, http_client=self.http(), api_key=KEY, **options)


async def failure(*responses: httpx.Response) -> tuple[ProviderError, Server]:
    server = Server(*responses)
    with pytest.raises(ProviderError) as info:
        await server.transport().request(ModelRequest("sys", (), (UserMessage("hi"),)))
    return info.value, server


# --- to the wire -----------------------------------------------------------------------------


def test_assistant_text_and_calls_become_one_turn_of_blocks() -> None:
    body = wire(UserMessage("q"), AssistantMessage("Looking.", (FETCH,)), result(FETCH, "page"))
    assert body["messages"][1] == {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Looking."},
            {
                "type": "tool_use",
                "id": "toolu_01A",
                "name": "fetch",
                "input": {"url": "https://example.org"},
            },
        ],
    }


def test_assistant_without_text_sends_only_tool_use_blocks() -> None:
    body = wire(UserMessage("q"), AssistantMessage(None, (FETCH,)), result(FETCH, "page"))
    assert [b["type"] for b in body["messages"][1]["content"]] == ["tool_use"]


def test_unparseable_arguments_go_out_as_empty_input_under_the_same_id() -> None:
    assert BROKEN.parse_error is not None
    error = result(BROKEN, "arguments are not valid JSON", is_error=True)
    body = wire(UserMessage("q"), AssistantMessage(None, (BROKEN,)), error)
    use = body["messages"][1]["content"][0]
    assert use == {"type": "tool_use", "id": "toolu_01B", "name": "fetch", "input": {}}
    assert body["messages"][2]["content"] == [
        {
            "type": "tool_result",
            "tool_use_id": "toolu_01B",
            "content": "arguments are not valid JSON",
            "is_error": True,
        },
    ]


def test_arguments_that_are_not_an_object_go_out_as_empty_input() -> None:
    listed = ToolCall.from_raw("toolu_01C", "fetch", "[1, 2]")
    body = wire(UserMessage("q"), AssistantMessage(None, (listed,)), result(listed, "bad"))
    assert body["messages"][1]["content"][0]["input"] == {}


def test_consecutive_user_items_merge_so_roles_alternate() -> None:
    body = wire(
        UserMessage("first"),
        UserMessage("second"),
        AssistantMessage("Fetching.", (FETCH,)),
        UserMessage("also check the README"),  # arrived while the call ran
        result(FETCH, "page"),
        UserMessage("thanks"),
    )
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
    assert body["messages"][0]["content"] == [
        {"type": "text", "text": "first"},
        {"type": "text", "text": "second"},
    ]
    # tool_result blocks lead their message, as the API requires.
    assert body["messages"][2]["content"] == [
        {"type": "tool_result", "tool_use_id": "toolu_01A", "content": "page"},
        {"type": "text", "text": "also check the README"},
        {"type": "text", "text": "thanks"},
    ]


def test_several_controls_are_appended_last_in_order() -> None:
    body = wire(
        UserMessage("q"),
        AssistantMessage(None, (FETCH,)),
        result(FETCH, "page"),
        tool_choice="none",
        volatile=("control one", "control two"),
    )
    assert body["tool_choice"] == {"type": "none"}
    assert body["messages"][-1]["content"][-3:] == [
        {"type": "tool_result", "tool_use_id": "toolu_01A", "content": "page"},
        {"type": "text", "text": "control one"},
        {"type": "text", "text": "control two"},
    ]


def test_the_frozen_prefix_and_the_last_history_item_are_cache_breakpoints() -> None:
    items = (UserMessage("q"), AssistantMessage(None, (FETCH,)), result(FETCH, "page"))
    request = ModelRequest("sys", (TOOL,), items, volatile=("control",))
    body = to_wire(request, model=MODEL, max_tokens=1024)
    assert body["system"] == [
        {"type": "text", "text": "sys", "cache_control": {"type": "ephemeral"}}
    ]
    assert breakpoints(body) == ["tool fetch", "system", "message 2 block 0"]
    # the volatile control comes after the last breakpoint, and is never one
    assert body["messages"][-1]["content"][-1] == {"type": "text", "text": "control"}


def test_the_last_settled_item_is_a_breakpoint_too_and_there_are_at_most_four() -> None:
    other = ToolCall.from_raw("toolu_01D", "fetch", '{"url": "https://example.org/2"}')
    items = (
        UserMessage("q"),
        AssistantMessage(None, (FETCH,)),
        result(FETCH, "[elided to save context: ...]"),
        AssistantMessage("Next.", (other,)),
        result(other, "page two"),
    )
    request = ModelRequest("sys", (TOOL, TOOL), items, settled_items=3, volatile=("control",))
    body = to_wire(request, model=MODEL, max_tokens=1024)
    assert breakpoints(body) == ["tool fetch", "system", "message 2 block 0", "message 4 block 0"]
    assert len(breakpoints(body)) <= 4
    assert body["tools"][0] == {
        "name": "fetch",
        "description": "Download a page.",
        "input_schema": TOOL.parameters,
    }


def test_a_settled_last_item_is_one_breakpoint_and_thinking_blocks_carry_none() -> None:
    thinking = AssistantMessage(None, (), {THINKING_KEY: [THINKING]})
    request = ModelRequest("", (), (UserMessage("q"), thinking), settled_items=2)
    assert breakpoints(to_wire(request, model=MODEL, max_tokens=1024)) == []
    request = ModelRequest("", (), (UserMessage("q"),), settled_items=1)
    assert breakpoints(to_wire(request, model=MODEL, max_tokens=1024)) == ["message 0 block 0"]


def test_controls_after_an_assistant_turn_start_a_final_user_message() -> None:
    body = wire(UserMessage("q"), AssistantMessage("Draft."), volatile=("control",))
    assert body["messages"][-1] == {
        "role": "user",
        "content": [{"type": "text", "text": "control"}],
    }


def test_tool_choice_is_omitted_by_default_and_without_tools() -> None:
    assert "tool_choice" not in wire(UserMessage("q"))
    bare = wire(UserMessage("q"), tool_choice="none", tools=())
    assert "tool_choice" not in bare and "tools" not in bare


_TURNS = st.lists(
    st.one_of(
        st.just("user"),
        st.tuples(st.integers(0, 3), st.booleans(), st.booleans()),  # calls, text, user between
    ),
    max_size=8,
)


@given(_TURNS, st.lists(st.text(min_size=1), max_size=3))
def test_any_history_alternates_and_keeps_every_pair(turns: list[Any], controls: list[str]) -> None:
    items: list[Any] = [UserMessage("q")]
    for n, turn in enumerate(turns):
        if turn == "user":
            items.append(UserMessage(f"u{n}"))
            continue
        count, text, interrupt = turn
        calls = [ToolCall.from_raw(f"t{n}_{i}", "fetch", "{}") for i in range(count)]
        items.append(AssistantMessage("x" if text or not calls else None, tuple(calls)))
        if interrupt:
            items.append(UserMessage(f"interrupt {n}"))
        items.extend(result(call, "r") for call in calls)
    messages = wire(*items, volatile=tuple(controls))["messages"]

    roles = [m["role"] for m in messages]
    assert roles[0] == "user" and all(a != b for a, b in itertools.pairwise(roles))
    for before, message in itertools.pairwise(messages):
        kinds = [b["type"] for b in message["content"]]
        assert kinds == sorted(kinds, key=lambda k: k != "tool_result")  # results lead
        used = [b["id"] for b in before["content"] if b["type"] == "tool_use"]
        answered = [b["tool_use_id"] for b in message["content"] if b["type"] == "tool_result"]
        assert answered == used
    if controls:
        tail = messages[-1]["content"][-len(controls) :]
        assert tail == [{"type": "text", "text": c} for c in controls]


# --- from the wire ---------------------------------------------------------------------------


def test_thinking_blocks_round_trip_unchanged_before_the_tool_use() -> None:
    response = from_wire(
        message_body(
            [
                THINKING,
                REDACTED,
                {"type": "text", "text": "Fetching."},
                {
                    "type": "tool_use",
                    "id": "toolu_01A",
                    "name": "fetch",
                    "input": {"url": "https://example.org"},
                },
            ]
        )
    )
    assert response.provider_details == {THINKING_KEY: [THINKING, REDACTED]}
    assert (response.text, response.tool_calls) == ("Fetching.", (FETCH,))
    replayed = AssistantMessage(response.text, response.tool_calls, response.provider_details)
    body = wire(UserMessage("q"), replayed, result(FETCH, "page"))
    assert body["messages"][1]["content"][:3] == [
        THINKING,
        REDACTED,
        {"type": "text", "text": "Fetching."},
    ]


async def test_thinking_blocks_survive_the_sdk_parse() -> None:
    server = Server(
        httpx.Response(
            200, json=message_body([THINKING, REDACTED, {"type": "text", "text": "Done."}])
        )
    )
    response = await server.transport().request(ModelRequest("sys", (), (UserMessage("q"),)))
    assert response.provider_details == {THINKING_KEY: [THINKING, REDACTED]}
    assert response.text == "Done."


def test_text_blocks_concatenate_and_no_text_is_none() -> None:
    both = from_wire(message_body([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]))
    assert both.text == "ab"
    assert from_wire(message_body([])).text is None


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        ({"input_tokens": 7, "output_tokens": 3}, (7, 3, 0)),
        (
            {
                "input_tokens": 7,
                "output_tokens": 3,
                "cache_read_input_tokens": None,
                "cache_creation_input_tokens": None,
            },
            (7, 3, 0),
        ),
        ({"input_tokens": 7, "output_tokens": 3, "cache_creation_input_tokens": 50}, (57, 3, 0)),
        ({"input_tokens": 7, "output_tokens": 3, "cache_read_input_tokens": 40}, (47, 3, 40)),
        (None, (0, 0, 0)),
    ],
)
def test_usage_with_missing_cache_fields(usage: Any, expected: tuple[int, int, int]) -> None:
    mapped = map_usage(usage)
    assert (mapped.input_tokens, mapped.output_tokens, mapped.cached_input_tokens) == expected


# --- errors ----------------------------------------------------------------------------------


def test_retry_after_reads_milliseconds_seconds_and_http_dates() -> None:
    now = 1_792_567_680.0  # Wed, 21 Oct 2026 07:28:00 GMT
    assert parse_retry_after({"retry-after": "Wed, 21 Oct 2026 07:28:30 GMT"}, now) == 30
    assert parse_retry_after({"retry-after": "Wed, 21 Oct 2026 07:27:00 GMT"}, now) == 0
    assert parse_retry_after({"retry-after-ms": "1500", "retry-after": "9"}, now) == 1.5
    assert parse_retry_after({"retry-after": "2.5"}, now) == 2.5
    assert parse_retry_after({"retry-after": "soon"}, now) is None
    assert parse_retry_after({}, now) is None


async def test_retry_after_as_an_http_date_reaches_the_error() -> None:
    date = formatdate(timeval=time.time() + 120, usegmt=True)
    error, _ = await failure(
        httpx.Response(503, json=error_body("api_error", "busy"), headers={"retry-after": date})
    )
    assert error.retryable and error.retry_after is not None
    assert 110 < error.retry_after <= 120


@pytest.mark.parametrize(
    ("status", "kind", "retryable"),
    [
        (529, "overloaded_error", True),
        (408, "timeout_error", True),
        (409, "api_error", True),
        (502, "api_error", True),
        (400, "invalid_request_error", False),
        (413, "request_too_large", False),
        (422, "invalid_request_error", False),
    ],
)
async def test_statuses_are_classified_after_exactly_one_attempt(
    status: int, kind: str, retryable: bool
) -> None:
    error, server = await failure(httpx.Response(status, json=error_body(kind, "Overloaded")))
    assert (error.status, error.retryable) == (status, retryable)
    assert error.message.startswith(f"anthropic: HTTP {status} {kind}: Overloaded")
    assert len(server.sent) == 1  # the SDK does not retry; the gateway does


async def test_prompt_too_long_is_not_retryable() -> None:
    text = "prompt is too long: 210000 tokens > 200000 maximum"
    error, _ = await failure(httpx.Response(400, json=error_body("invalid_request_error", text)))
    assert not error.retryable and text in error.message


async def test_an_error_body_that_is_not_json_still_gives_a_message() -> None:
    error, _ = await failure(httpx.Response(502, text="<html>Bad Gateway</html>"))
    assert error.retryable and "Bad Gateway" in error.message


async def test_a_given_client_is_made_to_stop_retrying() -> None:
    sent: list[httpx2.Request] = []

    def overloaded(request: httpx2.Request) -> httpx2.Response:
        sent.append(request)
        return httpx2.Response(529, json=error_body("overloaded_error", "Overloaded"))

    http = httpx2.AsyncClient(transport=httpx2.MockTransport(overloaded))
    client = anthropic.AsyncAnthropic(api_key=KEY, http_client=http, max_retries=5)
    with pytest.raises(ProviderError) as info:
        await AnthropicTransport(MODEL, client=client).request(
            ModelRequest("sys", (), (UserMessage("hi"),))
        )
    assert info.value.retryable and len(sent) == 1


# --- the key and the HTTP bridge ---------------------------------------------------------------


async def test_the_api_key_is_sent_but_never_appears_in_messages_or_repr() -> None:
    echoed = error_body("authentication_error", f"invalid x-api-key: {KEY}")
    error, server = await failure(httpx.Response(401, json=echoed))
    assert server.sent[0].headers["authorization"] == f"Bearer {KEY}"
    assert KEY not in error.message and "[redacted]" in error.message
    assert error.__cause__ is None and error.__suppress_context__
    transport = server.transport()
    assert KEY not in repr(transport)
    assert all(
        KEY not in repr(value) for name, value in vars(transport).items() if name != "_client"
    )


async def test_the_key_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-from-env")
    server = Server(httpx.Response(200, json=message_body([{"type": "text", "text": "ok"}])))
    http = httpx.AsyncClient(transport=httpx.MockTransport(server))
    transport = AnthropicTransport(MODEL, http_client=http)
    assert isinstance(transport, Transport) and transport.name == f"anthropic:{MODEL}"
    await transport.request(ModelRequest("sys", (), (UserMessage("q"),)))
    assert server.sent[0].headers["authorization"] == "Bearer sk-ant-from-env"


def test_no_key_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(ConfigError, match="ANTHROPIC_API_KEY"):
        AnthropicTransport(MODEL)


def test_a_client_and_client_parts_together_are_a_config_error() -> None:
    client = anthropic.AsyncAnthropic(api_key=KEY)
    with pytest.raises(ConfigError, match="either client"):
        AnthropicTransport(MODEL, client=client, api_key=KEY)


async def test_compressed_responses_are_decoded_once() -> None:
    raw = json.dumps(message_body([{"type": "text", "text": "zipped"}])).encode()
    server = Server(
        httpx.Response(
            200,
            content=gzip.compress(raw),
            headers={"content-type": "application/json", "content-encoding": "gzip"},
        )
    )
    response = await server.transport().request(ModelRequest("sys", (), (UserMessage("q"),)))
    assert response.text == "zipped"


async def test_the_sdk_timeout_travels_through_the_bridge() -> None:
    # httpx's own 5 s default would cut a long answer short; the SDK's 10 minutes apply.
    server = Server(httpx.Response(200, json=message_body([{"type": "text", "text": "ok"}])))
    await server.transport().request(ModelRequest("sys", (), (UserMessage("q"),)))
    assert server.sent[0].extensions["timeout"]["read"] == 600
