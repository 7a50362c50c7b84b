"""ADR 0039 (streaming text): deltas arrive while the answer is written, through each
provider's real SDK from a loopback server that sends server-sent events with pauses; they
concatenate to the recorded answer; a stream cut mid-way emits the discard marker before the
retry; `--events` lines are JSON in order; nobody listening, nothing streams; streaming
changes the request by its stream flag only and the record not at all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import keel
from contract import case_anthropic, case_openai_chat, case_openai_responses
from keel.records import ModelResponseReceived
from keel.transports.anthropic import AnthropicTransport
from keel.transports.base import Transport
from keel.transports.openai_chat import OpenAIChatTransport
from keel.transports.openai_responses import OpenAIResponsesTransport
from keel.transports.scripted import ScriptedTransport
from keel.transports.streaming import TextDelta, TextDiscarded
from loopback_http import QuietHandler, serving

SRC = str(Path(keel.__file__).parents[1])
PIECES = ["The loop ", "depends on ", "the breaker."]
ANSWER = "".join(PIECES)
PAUSE = 0.4

Chunk = tuple[dict[str, Any] | str, float]
"""One SSE event's data (an object, or raw text such as "[DONE]") and the pause after it."""


class SseServer(ThreadingHTTPServer):
    """Answers each POST with the next stream: its events, each followed by its pause; a
    stream marked `cut` stops after its events without finishing (the connection closes)."""

    def __init__(self, streams: list[list[Chunk]], plain: list[dict[str, Any]] | None = None):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.streams = streams
        self.plain = plain or []
        self.bodies: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(QuietHandler):
    server: SseServer

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        with self.server.lock:
            self.server.bodies.append(body)
            if not body.get("stream"):
                self.reply(json.dumps(self.server.plain.pop(0)).encode())
                return
            stream = self.server.streams.pop(0)
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("connection", "close")
        self.end_headers()
        for data, pause in stream:
            text = data if isinstance(data, str) else json.dumps(data)
            self.wfile.write(f"data: {text}\n\n".encode())
            self.wfile.flush()
            time.sleep(pause)
        self.close_connection = True


def responses_stream(pieces: list[str], *, finish: bool = True) -> list[Chunk]:
    chunks: list[Chunk] = [
        ({"type": "response.output_text.delta", "delta": p, "output_index": 0}, PAUSE)
        for p in pieces
    ]
    if finish:
        full = case_openai_responses.CASE.text_response().json()
        chunks.append(({"type": "response.completed", "response": full}, 0))
    return chunks


def chat_stream(pieces: list[str]) -> list[Chunk]:
    full = case_openai_chat.CASE.text_response().json()
    head = {k: full[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    chunks: list[Chunk] = [({**head, "choices": [{"index": 0, "delta": {"role": "assistant"}}]}, 0)]
    for p in pieces:
        chunks.append(({**head, "choices": [{"index": 0, "delta": {"content": p}}]}, PAUSE))
    chunks.append(({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}, 0))
    chunks.append(({**head, "choices": [], "usage": full["usage"]}, 0))
    chunks.append(("[DONE]", 0))
    return chunks


def anthropic_stream(pieces: list[str]) -> list[Chunk]:
    full = case_anthropic.CASE.text_response().json()
    start = {**full, "content": [], "stop_reason": None}
    chunks: list[Chunk] = [
        ({"type": "message_start", "message": start}, 0),
        (
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
            0,
        ),
    ]
    for p in pieces:
        delta = {"type": "text_delta", "text": p}
        chunks.append(({"type": "content_block_delta", "index": 0, "delta": delta}, PAUSE))
    chunks += [
        ({"type": "content_block_stop", "index": 0}, 0),
        (
            {
                "type": "message_delta",
                "delta": {"stop_reason": full["stop_reason"], "stop_sequence": None},
                "usage": full["usage"],
            },
            0,
        ),
        ({"type": "message_stop"}, 0),
    ]
    return chunks


Make = Callable[[str], Transport]
PROVIDERS: dict[str, tuple[Make, Callable[[list[str]], list[Chunk]], Any, tuple[str, ...]]] = {
    "openai_responses": (
        lambda url: OpenAIResponsesTransport("gpt-5", base_url=url + "/v1", api_key="sk-test"),
        responses_stream,
        case_openai_responses.CASE,
        ("stream",),
    ),
    "openai_chat": (
        lambda url: OpenAIChatTransport(  # unwatched requests go whole, as they do to OpenAI
            "gpt-5", base_url=url + "/v1", api_key="sk-test", stream="when-watched"
        ),
        chat_stream,
        case_openai_chat.CASE,
        ("stream", "stream_options"),
    ),
    "anthropic": (
        lambda url: AnthropicTransport("claude-sonnet-4-6", base_url=url, api_key="sk-ant-test"),
        anthropic_stream,
        case_anthropic.CASE,
        ("stream",),
    ),
}


def recorded(event: ModelResponseReceived) -> tuple[Any, ...]:
    """What a response event records, but its place (seq, time)."""
    return (
        event.text,
        event.tool_calls,
        event.usage,
        event.stop_reason,
        event.empty,
        event.provider_details,
    )


async def collect(agent: keel.Agent, question: str) -> tuple[list[tuple[float, Any]], Any]:
    stream = agent.stream(question)
    seen = [(time.monotonic(), event) async for event in stream]
    return seen, await stream


@pytest.fixture
def sse() -> Iterator[Callable[..., SseServer]]:
    servers: list[Any] = []

    def start(streams: list[list[Chunk]], plain: list[dict[str, Any]] | None = None) -> SseServer:
        context = serving(SseServer(streams, plain))
        servers.append(context)
        return context.__enter__()

    yield start
    for context in servers:
        context.__exit__(None, None, None)


@pytest.mark.parametrize("name", sorted(PROVIDERS))
async def test_deltas_arrive_before_the_response_is_complete_and_make_the_recorded_answer(
    name: str, tmp_path: Path, sse: Callable[..., SseServer]
) -> None:
    make, stream_of, case, flags = PROVIDERS[name]
    plain_answer = case.text_response().json()
    server = sse([stream_of(PIECES)], [plain_answer])
    agent = keel.Agent(make(server.url), store=tmp_path / "runs.sqlite")
    seen, result = await collect(agent, "Which?")

    deltas = [(at, e) for at, e in seen if isinstance(e, TextDelta)]
    received = [(at, e) for at, e in seen if isinstance(e, ModelResponseReceived)]
    assert [e.text for _, e in deltas] == PIECES
    assert {(e.step, e.attempt) for _, e in deltas} == {(1, 1)}
    assert deltas[0][0] < received[0][0] - PAUSE  # shown while the rest was still coming
    assert "".join(e.text for _, e in deltas) == result.answer == received[0][1].text
    stored = agent.store.events(result.run_id)
    assert not any(isinstance(e, TextDelta | TextDiscarded) for e in stored)  # never stored

    # The same answer unstreamed: the same record, and a request that differs by the flag only.
    plain = await keel.Agent(make(server.url), store=tmp_path / "runs.sqlite").arun("Which?")
    plain_received = next(
        e for e in agent.store.events(plain.run_id) if isinstance(e, ModelResponseReceived)
    )
    streamed_received = received[0][1]
    assert recorded(plain_received) == recorded(streamed_received)
    streamed_body, plain_body = server.bodies
    assert "stream" not in plain_body
    strip = {k: v for k, v in streamed_body.items() if k not in flags}
    assert json.dumps(strip).replace(result.run_id, "R") == json.dumps(plain_body).replace(
        plain.run_id, "R"
    )
    assert result.model_calls == 1 and plain.model_calls == 1  # deltas are never counted


async def test_a_stream_cut_mid_way_is_retried_after_a_discard_marker(
    tmp_path: Path, sse: Callable[..., SseServer]
) -> None:
    server = sse([responses_stream(["The loop "], finish=False), responses_stream(PIECES)])
    transport = OpenAIResponsesTransport("gpt-5", base_url=server.url + "/v1", api_key="sk-test")
    limits = keel.Limits(retry_base_delay=0.01, retry_max_delay=0.01)
    agent = keel.Agent(transport, store=tmp_path / "runs.sqlite", limits=limits)
    seen, result = await collect(agent, "Which?")

    live = [e for _, e in seen if isinstance(e, TextDelta | TextDiscarded)]
    assert live[0] == TextDelta("The loop ", 1, 1)
    assert live[1] == TextDiscarded(1, 1)
    assert [e.text for e in live[2:] if isinstance(e, TextDelta)] == PIECES
    assert {(e.step, e.attempt) for e in live[2:]} == {(1, 2)}
    assert result.status == "completed" and result.answer == ANSWER
    assert result.model_calls == 2  # the cut attempt counts as a model call, its text does not


def test_nobody_listening_nothing_streams(tmp_path: Path, sse: Callable[..., SseServer]) -> None:
    server = sse([], [case_openai_responses.CASE.text_response().json()])
    transport = OpenAIResponsesTransport("gpt-5", base_url=server.url + "/v1", api_key="sk-test")
    result = keel.Agent(transport, store=tmp_path / "runs.sqlite").run("Which?")
    assert result.status == "completed"
    assert "stream" not in server.bodies[0]


async def test_the_scripted_model_streams_word_by_word_with_stream_ms(tmp_path: Path) -> None:
    script = {"turns": [{"text": "one two three"}], "stream_ms": 150}
    agent = keel.Agent(ScriptedTransport.from_dict(script), store=tmp_path / "runs.sqlite")
    seen, result = await collect(agent, "Q")
    deltas = [(at, e) for at, e in seen if isinstance(e, TextDelta)]
    assert [e.text for _, e in deltas] == ["one", " two", " three"]
    assert deltas[-1][0] - deltas[0][0] >= 0.25
    assert "".join(e.text for _, e in deltas) == result.answer
    quiet = {"turns": [{"text": "one two three"}]}  # without stream_ms: no deltas at all
    seen, _ = await collect(keel.Agent(ScriptedTransport.from_dict(quiet)), "Q")
    assert not any(isinstance(e, TextDelta) for _, e in seen)


def test_events_lines_carry_the_deltas_as_json_in_order(
    tmp_path: Path, sse: Callable[..., SseServer]
) -> None:
    server = sse([responses_stream(PIECES)])
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "keel",
            "run",
            "Which?",
            "--events",
            "--model",
            "openai:gpt-5",
            "--base-url",
            server.url + "/v1",
            "--store",
            str(tmp_path / "runs.sqlite"),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": SRC, "OPENAI_API_KEY": "sk-test", "HOME": str(tmp_path)},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    types = [line["type"] for line in lines]
    deltas = [line for line in lines if line["type"] == "text_delta"]
    assert deltas == [{"type": "text_delta", "text": p, "step": 1, "attempt": 1} for p in PIECES]
    assert types.index("model_request") < types.index("text_delta")
    assert max(i for i, t in enumerate(types) if t == "text_delta") < types.index("model_response")
    assert types[-1] == "result" and lines[-1]["answer"] == ANSWER


def chat_stream_of(full: dict[str, Any]) -> list[Chunk]:
    """A chat.completion as the chunks a server streams it in: content and each call's
    arguments in two pieces."""
    head = {k: full[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    choice = full["choices"][0]
    message = choice["message"]

    def chunk(delta: dict[str, Any], **more: Any) -> Chunk:
        return ({**head, "choices": [{"index": 0, "delta": delta, **more}]}, 0)

    chunks = [chunk({"role": "assistant"})]
    text = message.get("content") or ""
    chunks += [chunk({"content": part}) for part in (text[:5], text[5:]) if part]
    for i, call in enumerate(message.get("tool_calls") or ()):
        args = call["function"]["arguments"]
        first = {"index": i, "id": call["id"], "type": "function"}
        first["function"] = {"name": call["function"]["name"], "arguments": args[:7]}
        chunks.append(chunk({"tool_calls": [first]}))
        chunks.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": args[7:]}}]}))
    chunks.append(chunk({}, finish_reason=choice["finish_reason"]))
    chunks.append(({**head, "choices": [], "usage": full["usage"]}, 0))
    return [*chunks, ("[DONE]", 0)]


def anthropic_stream_of(full: dict[str, Any]) -> list[Chunk]:
    """A Messages API message as the events a server streams it in."""
    chunks: list[Chunk] = [({"type": "message_start", "message": {**full, "content": []}}, 0)]
    for i, block in enumerate(full["content"]):

        def delta(body: dict[str, Any], i: int = i) -> Chunk:
            return ({"type": "content_block_delta", "index": i, "delta": body}, 0)

        kind = block["type"]
        start = {"text": {"type": "text", "text": ""}, "tool_use": {**block, "input": {}}}
        start["thinking"] = {"type": "thinking", "thinking": "", "signature": ""}
        opened = start.get(kind, block)
        chunks.append(({"type": "content_block_start", "index": i, "content_block": opened}, 0))
        if kind == "text":
            chunks += [
                delta({"type": "text_delta", "text": p})
                for p in (block["text"][:4], block["text"][4:])
            ]
        elif kind == "tool_use":
            raw = json.dumps(block["input"])
            chunks += [
                delta({"type": "input_json_delta", "partial_json": p}) for p in (raw[:6], raw[6:])
            ]
        elif kind == "thinking":
            chunks.append(delta({"type": "thinking_delta", "thinking": block["thinking"]}))
            chunks.append(delta({"type": "signature_delta", "signature": block["signature"]}))
        chunks.append(({"type": "content_block_stop", "index": i}, 0))
    stop = {"stop_reason": full["stop_reason"], "stop_sequence": full.get("stop_sequence")}
    chunks.append(({"type": "message_delta", "delta": stop, "usage": full["usage"]}, 0))
    return [*chunks, ({"type": "message_stop"}, 0)]


SIGNATURE = "EqQBCkgIBRABGAIiQL6mIuBrzCvBJ2oJ3LKTH0XK4Qhfb0C4s8zRJqYxEw" + "A" * 40


def anthropic_thinking_tool_calls() -> dict[str, Any]:
    full: dict[str, Any] = case_anthropic.CASE.tool_calls_response().json()
    thinking = [
        {"type": "thinking", "thinking": "Both sources are needed.", "signature": SIGNATURE},
        {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5"},
    ]
    return {**full, "content": [*thinking, *full["content"]]}


FOLDED: dict[str, tuple[Make, Callable[[], dict[str, Any]], Callable[..., list[Chunk]]]] = {
    "openai_chat_tool_calls": (
        PROVIDERS["openai_chat"][0],
        lambda: case_openai_chat.CASE.tool_calls_response().json(),
        chat_stream_of,
    ),
    "anthropic_thinking_tool_calls": (
        PROVIDERS["anthropic"][0],
        anthropic_thinking_tool_calls,
        anthropic_stream_of,
    ),
}


@pytest.mark.parametrize("name", sorted(FOLDED))
async def test_a_streamed_answer_folds_into_the_response_the_unstreamed_one_is(
    name: str, sse: Callable[..., SseServer]
) -> None:
    """Tool calls, their arguments in pieces, thinking blocks and their signatures: the
    response built from the stream is the response of the same answer sent whole."""
    from contract.harness import ordinary_request

    make, full, stream_of = FOLDED[name]
    server = sse([stream_of(full())], [full()])
    transport = make(server.url)
    texts: list[str] = []
    streamed = await transport.request_streaming(ordinary_request(), texts.append)  # type: ignore[attr-defined]
    plain = await transport.request(ordinary_request())
    assert streamed == plain
    assert "".join(texts) == (plain.text or "")


async def test_the_local_model_streams_its_answer_as_it_generates(local_transport: Any) -> None:
    """The embedded model (llama.cpp, generating in a worker thread): the pieces reach the
    event loop in order, before the response, and make its text."""
    from keel.messages import ModelRequest, UserMessage

    request = ModelRequest("Answer in one sentence.", (), (UserMessage("What is a lease?"),))
    pieces: list[tuple[float, str]] = []
    streamed = await local_transport.request_streaming(
        request, lambda text: pieces.append((time.monotonic(), text))
    )
    done = time.monotonic()
    assert streamed.text and len(pieces) > 3
    assert "".join(p for _, p in pieces) == streamed.text
    assert pieces[0][0] < pieces[-1][0] < done  # handed out while the generation went on


def test_keel_run_on_a_terminal_prints_the_answer_as_it_is_written_once(tmp_path: Path) -> None:
    """stdout a terminal (a pty): the answer streams there word by word and is not printed a
    second time at the end; the summary line goes to stderr after it."""
    import pty

    model = tmp_path / "model.json"
    model.write_text(json.dumps({"turns": [{"text": "one two three four"}], "stream_ms": 100}))
    leader, follower = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "keel", "run", "Q", "--model", f"script:{model}",
         "--store", str(tmp_path / "runs.sqlite")],
        stdout=follower,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": SRC, "HOME": str(tmp_path)},
    )  # fmt: skip
    os.close(follower)
    shown = b""
    arrivals: list[float] = []
    while True:
        try:
            data = os.read(leader, 1024)
        except OSError:  # the pty closed: the process ended
            break
        if not data:
            break
        arrivals.append(time.monotonic())
        shown += data
    os.close(leader)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    text = shown.decode().replace("\r\n", "\n")
    assert text.count("one two three four") == 1, text
    assert arrivals[-1] - arrivals[0] >= 0.2  # it came in pieces over time
    assert b"completed" in err
