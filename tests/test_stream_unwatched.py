"""A request to a server other than OpenAI's own API is streamed even when nobody watches its
text (`OpenAIChatTransport` ``stream="always"``, ADR 0065): llama-cpp-python's server stops
generating only when a streamed request's client goes away. That server sends no usage in a
stream, so Keel counts such an answer's tokens itself and marks them estimated; the token budget
still ends the run."""

from __future__ import annotations

import json
from http.server import ThreadingHTTPServer
from typing import Any

import httpx
import pytest

import keel
from keel.limits import Limits
from keel.messages import ModelRequest, ToolDefinition, UserMessage
from keel.records import ModelResponseReceived
from keel.transports.openai_chat import OpenAIChatTransport
from loopback_http import QuietHandler, serving

TOOL = ToolDefinition("note", "Read a note.", {"type": "object", "properties": {}})


@keel.tool
def note(topic: str) -> str:
    """Read the note on a topic."""
    return f"the note on {topic} says: " + "evidence " * 40


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    """One chunk as llama-cpp-python's server writes it: no ``usage`` key at all."""
    chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": "m",
             "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}  # fmt: skip
    return f"data: {json.dumps(chunk)}\n\n".encode()


def _stream(body: dict[str, Any], turn: int) -> bytes:
    """A call of `note` on each turn with tools, an answer on a turn that allows none."""
    if not body.get("tools") or body.get("tool_choice") == "none":
        text = "The notes agree: evidence enough for an answer."
        parts = [_chunk({"role": "assistant", "content": text}), _chunk({}, "stop")]
    else:
        arguments = json.dumps({"topic": f"t{turn}"})
        call = {"index": 0, "id": f"call_{turn}", "type": "function",
                "function": {"name": "note", "arguments": arguments}}  # fmt: skip
        parts = [_chunk({"role": "assistant", "tool_calls": [call]}), _chunk({}, "tool_calls")]
    return b"".join(parts) + b"data: [DONE]\n\n"


class _NoUsageServer(ThreadingHTTPServer):
    bodies: list[dict[str, Any]]


class _Handler(QuietHandler):
    server: _NoUsageServer

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        self.server.bodies.append(body)
        if body.get("stream"):
            self.reply(_stream(body, len(self.server.bodies)), "text/event-stream")
            return
        self.reply(json.dumps({"error": {"message": "this test server only streams"}}).encode())


def test_a_stream_without_usage_is_counted_estimated_and_the_token_budget_ends_the_run(
    tmp_path: Any,
) -> None:
    server = _NoUsageServer(("127.0.0.1", 0), _Handler)
    server.bodies = []
    with serving(server):
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        chat = OpenAIChatTransport("m", base_url=url, api_key="k")
        agent = keel.Agent(
            chat, tools=[note], store=tmp_path / "r.db", limits=Limits(max_tokens=3_000)
        )
        with agent:
            result = agent.run("What do the notes say?")
            events = agent.store.events(result.run_id)
    assert all(body.get("stream") is True for body in server.bodies)
    responses = [e for e in events if isinstance(e, ModelResponseReceived)]
    assert responses and all(r.usage.estimated for r in responses)
    assert all(r.usage.input_tokens > 0 and r.usage.output_tokens > 0 for r in responses)
    assert result.usage.estimated and result.usage.total > 0
    assert result.status == "completed", result.failure
    assert result.synthesized == "budget"
    assert result.answer and "evidence enough" in result.answer
    assert 3 <= len(server.bodies) < 40


def _captured(base_url: str | None, api_key: str) -> tuple[OpenAIChatTransport, list[Any]]:
    """A transport over the real SDK whose requests are kept; every answer is a short stream."""
    sent: list[Any] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        body = _chunk({"role": "assistant", "content": "hi"}, "stop") + b"data: [DONE]\n\n"
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    client = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    return OpenAIChatTransport("m", http_client=client, base_url=base_url, api_key=api_key), sent


def _request() -> ModelRequest:
    return ModelRequest("Answer.", (TOOL,), (UserMessage("q"),))


async def test_a_base_url_server_is_sent_stream_true_by_default() -> None:
    transport, sent = _captured("http://127.0.0.1:8080/v1", "k")
    assert transport.stream == "always"
    response = await transport.request(_request())
    assert sent[0]["stream"] is True
    assert response.text == "hi" and response.usage.estimated


async def test_openai_itself_is_streamed_only_when_watched() -> None:
    transport, sent = _captured(None, "sk-test")
    assert transport.stream == "when-watched"
    heard: list[str] = []
    await transport.request_streaming(_request(), heard.append)
    assert sent[0]["stream"] is True and heard == ["hi"]
    with pytest.raises(keel.errors.ProviderError):  # the answer of a whole request is JSON
        await transport.request(_request())
    assert "stream" not in sent[1]


async def test_stream_when_watched_can_be_chosen_for_a_base_url_server() -> None:
    transport, sent = _captured("http://127.0.0.1:8080/v1", "k")
    transport = OpenAIChatTransport(
        "m", http_client=transport._client._client, base_url="http://127.0.0.1:8080/v1",
        api_key="k", stream="when-watched",
    )  # fmt: skip
    with pytest.raises(keel.errors.ProviderError):
        await transport.request(_request())
    assert "stream" not in sent[0]
