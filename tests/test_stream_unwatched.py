"""A request to a server other than OpenAI's own API is streamed even when nobody watches its
text (`OpenAIChatTransport` ``stream="always"``, ADR 0065): llama-cpp-python's server stops
generating only when a streamed request's client goes away. That server sends no usage in a
stream, so Keel counts such an answer's tokens itself and marks them estimated; the token budget
still ends the run."""

from __future__ import annotations

import json
from dataclasses import replace
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

EVENTS = {"content-type": "text/event-stream"}
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


LLAMA_OVERFLOW = {
    "error": {
        "message": "This model's maximum context length is 4096 tokens. However, you requested "
        "6015 tokens (6007 in the messages, 8 in the completion). Please reduce the length of "
        "the messages or completion.",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }
}
"""llama-cpp-python 0.3.36's answer to a whole request over its window (`server/errors.py`)."""


class _Broken(httpx.AsyncByteStream):
    """A stream body that sends `first` and then breaks, as a server that dies mid-answer."""

    def __init__(self, first: bytes = b"") -> None:
        self.first = first

    async def __aiter__(self) -> Any:
        if self.first:
            yield self.first
        raise httpx.RemoteProtocolError("peer closed connection without sending complete body")


def _overflowing(stream_body: Any) -> tuple[OpenAIChatTransport, list[Any]]:
    """A transport whose server starts a streamed answer with a 200 and then `stream_body`
    (as llama-cpp-python's does when the request is over its window: nothing, then the close),
    and answers the same request unstreamed with its 400."""
    sent: list[Any] = []

    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        sent.append(body)
        if body.get("stream"):
            headers = {"content-type": "text/event-stream; charset=utf-8"}
            if stream_body is None:  # closed before the SDK had the answer: a connection error
                raise httpx.RemoteProtocolError("Server disconnected", request=request)
            if isinstance(stream_body, bytes):
                return httpx.Response(200, headers=headers, content=stream_body)
            return httpx.Response(200, headers=headers, stream=stream_body)
        return httpx.Response(400, json=LLAMA_OVERFLOW)

    client = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    url = "http://127.0.0.1:8080/v1"
    return OpenAIChatTransport("m", http_client=client, base_url=url, api_key="k"), sent


@pytest.mark.parametrize("stream_body", [b"", _Broken(), None], ids=["ended", "broken", "closed"])
async def test_a_stream_that_ends_before_its_first_event_is_asked_whole_and_keeps_the_overflow(
    stream_body: Any,
) -> None:
    """Regression (a) of the first try (ADR 0065): the over-long request, streamed, ended as
    "the stream ended before the answer was complete" (retryable) instead of the server's 400.
    The same request is asked whole in the same attempt, and the server's own words make it a
    ContextOverflow with the server's numbers, not retried."""
    transport, sent = _overflowing(stream_body)
    with pytest.raises(keel.errors.ContextOverflow) as info:
        await transport.request(_request())
    assert [body.get("stream") for body in sent] == [True, None]
    assert sent[1]["messages"] == sent[0]["messages"]
    assert "stream_options" not in sent[1]
    assert info.value.status == 400 and not info.value.retryable
    assert (info.value.requested, info.value.limit) == (6015, 4096)


async def test_a_stream_cut_after_an_event_is_not_asked_again() -> None:
    """Once the server has started answering, a cut is a cut (retryable, ADR 0039): asking
    again whole would be a second generation, and one nobody could hang up on."""
    first = _chunk({"role": "assistant", "content": "Half"})
    transport, sent = _overflowing(_Broken(first))
    with pytest.raises(keel.errors.ProviderError, match="the stream was cut") as info:
        await transport.request(_request())
    assert len(sent) == 1 and info.value.retryable


async def test_a_kind_of_request_the_server_cannot_stream_goes_whole_after_the_first() -> None:
    """llama-cpp-python's chatml-function-calling refuses to stream a turn that lets the model
    choose a call ("Automatic streaming tool choice is not supported": a 200, then nothing).
    The first such request is asked again whole and answered; later ones go whole at once,
    while a turn that allows no call still streams (and can be hung up on)."""
    sent: list[Any] = []

    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        sent.append(body)
        if body.get("stream") and body.get("tool_choice") == "auto":
            return httpx.Response(200, headers=EVENTS)
        if body.get("stream"):
            stream = _chunk({"role": "assistant", "content": "done"}, "stop") + b"data: [DONE]\n\n"
            return httpx.Response(200, headers=EVENTS, content=stream)
        usage = {"prompt_tokens": 197, "completion_tokens": 9, "total_tokens": 206}
        message = {"role": "assistant", "content": "an answer"}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        return httpx.Response(200, json={"id": "c", "choices": [choice], "usage": usage})

    client = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    transport = OpenAIChatTransport(
        "m", http_client=client, base_url="http://127.0.0.1:8080/v1", tool_choice="auto"
    )
    first = await transport.request(_request())
    second = await transport.request(_request())
    synthesis = await transport.request(replace(_request(), tool_choice="none"))
    assert [(b.get("stream"), b.get("tool_choice")) for b in sent] == [
        (True, "auto"), (None, "auto"), (None, "auto"), (True, "none"),
    ]  # fmt: skip
    assert first.usage.input_tokens == second.usage.input_tokens == 197
    assert not first.usage.estimated  # the whole answer's counts are the server's
    assert synthesis.text == "done" and synthesis.usage.estimated


async def test_the_whole_request_after_an_empty_stream_is_sent_again_on_a_closed_line() -> None:
    """The server closes the connection its empty stream came on, and the pool may hand that
    connection to the whole request first ("Server disconnected without sending a response",
    seen against llama-cpp-python's server): that request is sent once more."""
    sent: list[Any] = []

    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        sent.append(body)
        if body.get("stream"):
            return httpx.Response(200, headers=EVENTS)
        if len(sent) == 2:
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
        return httpx.Response(400, json=LLAMA_OVERFLOW)

    client = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    transport = OpenAIChatTransport("m", http_client=client, base_url="http://127.0.0.1:8080/v1")
    with pytest.raises(keel.errors.ContextOverflow):
        await transport.request(_request())
    assert [body.get("stream") for body in sent] == [True, None, None]
