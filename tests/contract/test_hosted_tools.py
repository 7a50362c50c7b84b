"""Provider-hosted tools through the real SDKs (ADR 0067): what each transport declares, what it
reads of a turn that used them, streamed and not, and what it sends back on the next turn."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from keel.errors import ConfigError
from keel.hosted import HostedTool, citations, hosted_calls
from keel.messages import AssistantMessage, ModelRequest, ModelResponse, UserMessage
from keel.models import resolve_model
from keel.transports.anthropic import AnthropicTransport
from keel.transports.openai_responses import OpenAIResponsesTransport

from . import hosted_shapes as shapes
from .harness import SYSTEM, TOOLS, Recorder

QUESTION = "When should a client retry a 503?"
SSE = {"content-type": "text/event-stream"}


def anthropic(http: httpx.AsyncClient) -> AnthropicTransport:
    return AnthropicTransport(
        "claude-sonnet-4-6",
        http_client=http,
        api_key="sk-ant-api03-hosted-test-not-real",
        hosted_tools=[
            HostedTool("web_search", max_uses=2, domains=("rfc-editor.org", "mozilla.org")),
            HostedTool("web_fetch"),
        ],
    )


def openai(http: httpx.AsyncClient) -> OpenAIResponsesTransport:
    return OpenAIResponsesTransport(
        "gpt-5-mini",
        http_client=http,
        api_key="sk-proj-hosted-test-not-real",
        hosted_tools=[
            HostedTool("web_search", domains=("rfc-editor.org",)),
            HostedTool("file_search", stores=("vs_68af3f0e5b6c8191a1",)),
        ],
    )


def openai_response() -> dict[str, Any]:
    return {
        "id": "resp_68af40a0a1b28193",
        "object": "response",
        "created_at": 1764889800,
        "status": "completed",
        "error": None,
        "incomplete_details": None,
        "model": "gpt-5-mini-2025-08-07",
        "output": shapes.OPENAI_OUTPUT,
        "usage": {
            "input_tokens": 9_120,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 310,
            "output_tokens_details": {"reasoning_tokens": 128},
            "total_tokens": 9_430,
        },
        "store": False,
        "tools": [],
    }


def question() -> ModelRequest:
    return ModelRequest(SYSTEM, TOOLS, (UserMessage(QUESTION),))


def follow_up(response: ModelResponse) -> ModelRequest:
    """The next request of the run: the turn as the history holds it, then a user message."""
    turn = AssistantMessage(response.text, response.tool_calls, response.provider_details)
    return ModelRequest(SYSTEM, TOOLS, (UserMessage(QUESTION), turn, UserMessage("And a 429?")))


async def test_anthropic_declares_its_server_tools_after_keels_own() -> None:
    server = Recorder(httpx.Response(200, json=shapes.anthropic_message(shapes.ANTHROPIC_CONTENT)))
    await anthropic(server.http()).request(question())
    tools = server.body()["tools"]
    assert [t.get("name") for t in tools] == ["fetch", "read_file", "web_search", "web_fetch"]
    assert tools[2] == {
        "type": "web_search_20250305",
        "name": "web_search",
        "max_uses": 2,
        "allowed_domains": ["rfc-editor.org", "mozilla.org"],
    }
    assert tools[3] == {
        "type": "web_fetch_20250910",
        "name": "web_fetch",
        "citations": {"enabled": True},
        "cache_control": {"type": "ephemeral"},  # the frozen prefix ends with the last tool
    }
    assert server.sent[0].url.path == "/v1/messages"
    assert server.sent[0].headers["anthropic-beta"] == "web-fetch-2025-09-10"
    assert "extra_headers" not in server.body()


async def test_openai_declares_its_hosted_tools_and_asks_for_the_sources() -> None:
    server = Recorder(httpx.Response(200, json=openai_response()))
    await openai(server.http()).request(question())
    body = server.body()
    assert body["tools"][2:] == [
        {"type": "web_search", "filters": {"allowed_domains": ["rfc-editor.org"]}},
        {"type": "file_search", "vector_store_ids": ["vs_68af3f0e5b6c8191a1"]},
    ]
    assert body["include"] == ["web_search_call.action.sources"]
    assert body["store"] is False


async def read_anthropic(streamed: bool) -> ModelResponse:
    if streamed:
        answer = httpx.Response(200, content=shapes.anthropic_stream(), headers=SSE)
        heard: list[str] = []
        transport = anthropic(Recorder(answer).http())
        response = await transport.request_streaming(question(), heard.append)
        assert "".join(heard) == shapes.ANSWER
        return response
    answer = httpx.Response(200, json=shapes.anthropic_message(shapes.ANTHROPIC_CONTENT))
    return await anthropic(Recorder(answer).http()).request(question())


async def read_openai(streamed: bool) -> ModelResponse:
    if streamed:
        answer = httpx.Response(200, content=shapes.openai_stream(openai_response()), headers=SSE)
        heard: list[str] = []
        response = await openai(Recorder(answer).http()).request_streaming(question(), heard.append)
        assert "".join(heard) == shapes.ANSWER
        return response
    return await openai(Recorder(httpx.Response(200, json=openai_response())).http()).request(
        question()
    )


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
async def test_anthropic_server_calls_results_and_citations_are_read(streamed: bool) -> None:
    response = await read_anthropic(streamed)
    assert response.text == shapes.ANSWER
    assert response.tool_calls == ()  # nothing for Keel to run
    assert hosted_calls(response.provider_details) == shapes.ANTHROPIC_CALLS
    assert citations(response.provider_details) == shapes.ANTHROPIC_CITATIONS
    assert response.usage.input_tokens == 10_412 and response.usage.output_tokens == 236


async def test_a_streamed_anthropic_turn_keeps_the_blocks_a_whole_one_keeps() -> None:
    whole, streamed = await read_anthropic(False), await read_anthropic(True)
    assert streamed.provider_details == whole.provider_details


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
async def test_openai_hosted_calls_and_url_citations_are_read(streamed: bool) -> None:
    response = await read_openai(streamed)
    assert response.text == shapes.ANSWER
    assert response.tool_calls == ()
    assert hosted_calls(response.provider_details) == shapes.OPENAI_CALLS
    assert citations(response.provider_details) == shapes.OPENAI_CITATIONS


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
async def test_anthropic_sends_the_turns_server_blocks_back_exactly(streamed: bool) -> None:
    """The API needs server_tool_use and its result (encrypted_content, the citation's
    encrypted_index) again, unchanged and in order, when the history goes on."""
    response = await read_anthropic(streamed)
    server = Recorder(httpx.Response(200, json=shapes.anthropic_message([])))
    await anthropic(server.http()).request(follow_up(response))
    sent = server.body()["messages"][1]
    assert sent["role"] == "assistant"
    assert sent["content"] == shapes.ANTHROPIC_CONTENT


async def test_anthropic_keels_calls_stand_where_the_tool_use_blocks_were() -> None:
    content = [
        shapes.SEARCH_USE,
        shapes.SEARCH_RESULT,
        {"type": "text", "text": "Reading the RFC."},
        {"type": "tool_use", "id": "toolu_01Xa", "name": "fetch", "input": {"url": shapes.RFC_URL}},
    ]
    answer = httpx.Response(200, json=shapes.anthropic_message(content, "tool_use"))
    response = await anthropic(Recorder(answer).http()).request(question())
    assert [c.name for c in response.tool_calls] == ["fetch"]
    server = Recorder(httpx.Response(200, json=shapes.anthropic_message([])))
    await anthropic(server.http()).request(follow_up(response))
    assert server.body()["messages"][1]["content"] == content


async def test_openai_does_not_send_hosted_call_items_back() -> None:
    """With store false a ws_/fs_ id names nothing the server kept; the text goes back."""
    response = await read_openai(False)
    server = Recorder(httpx.Response(200, json=openai_response()))
    await openai(server.http()).request(follow_up(response))
    sent = server.body()["input"]
    assert [item["type"] for item in sent] == ["message", "message", "message"]
    assert sent[1] == {"type": "message", "role": "assistant", "content": shapes.ANSWER}
    assert shapes.WS_ID not in json.dumps(server.body())


async def test_a_paused_anthropic_turn_is_sent_back_and_continued_as_one_turn() -> None:
    """``pause_turn``: the server stopped a long run of server tool calls; the API asks for the
    paused turn to be sent back as it is, and the answer continues it."""
    paused = shapes.anthropic_message([shapes.SEARCH_USE, shapes.SEARCH_RESULT], "pause_turn")
    rest = shapes.anthropic_message([{"type": "text", "text": "Done."}])
    server = Recorder(httpx.Response(200, json=paused), httpx.Response(200, json=rest))
    response = await anthropic(server.http()).request(question())
    assert len(server.sent) == 2
    assert server.body(1)["messages"][-1] == {
        "role": "assistant",
        "content": [shapes.SEARCH_USE, shapes.SEARCH_RESULT],
    }
    assert response.text == "Done."
    assert response.stop_reason == "end_turn"
    assert [c.name for c in hosted_calls(response.provider_details)] == ["web_search"]
    assert response.usage.input_tokens == 2 * 10_412  # both parts were billed


def test_a_hosted_tool_its_provider_does_not_host_is_refused() -> None:
    with pytest.raises(ConfigError, match="anthropic does not host it"):
        AnthropicTransport("claude-sonnet-4-6", api_key="k", hosted_tools=[
            HostedTool("file_search", stores=("vs_1",))
        ])  # fmt: skip
    with pytest.raises(ConfigError, match="openai does not host it"):
        OpenAIResponsesTransport("gpt-5", api_key="k", hosted_tools=[HostedTool("web_fetch")])
    with pytest.raises(ConfigError, match="max_uses is Anthropic's"):
        OpenAIResponsesTransport(
            "gpt-5", api_key="k", hosted_tools=[HostedTool("web_search", max_uses=2)]
        )
    with pytest.raises(ConfigError, match="not by 'openai-chat:gpt-4o'"):
        resolve_model("openai-chat:gpt-4o", hosted_tools=[HostedTool("web_search")])


def test_a_hosted_tool_spec_reads_back_as_written() -> None:
    spec = "web_search:max_uses=3:domains=rfc-editor.org+mozilla.org"
    tool = HostedTool.parse(spec)
    assert tool == HostedTool("web_search", 3, ("rfc-editor.org", "mozilla.org"))
    assert tool.spec == spec
    with pytest.raises(ConfigError, match="needs its vector stores"):
        HostedTool.parse("file_search")
    with pytest.raises(ConfigError, match="is not max_uses=N"):
        HostedTool.parse("web_search:max=3")
