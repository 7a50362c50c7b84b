"""Nothing a provider sends can crash a run (tracker issue 20; ADR 0031), written as the attacks.

A loopback HTTP server answers with a hostile body, and the real SDK, through Keel's transport,
reads it inside a real run: fields of the wrong type, usage that is not a token count, a server
that trickles, an answer far too large (plain or a gzip bomb), an error message of megabytes,
numbers JSON cannot carry. Every one must end the run as a classified failure (`ModelError`, or
the deadline), never as an exception out of `agent.run`, and the JSON Keel prints stays JSON.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import openai
import pytest

import keel
from keel.messages import ModelRequest, ModelResponse, Usage
from keel.present.timeline import json_text
from keel.records import ModelErrorSeen
from keel.transports.anthropic import AnthropicTransport
from keel.transports.base import Transport
from keel.transports.openai_chat import OpenAIChatTransport
from keel.transports.openai_responses import OpenAIResponsesTransport
from loopback_http import QuietHandler, serving

KEY = "sk-test-hostile-0123456789abcdef"
FAST = {"retry_base_delay": 0.001, "retry_max_delay": 0.01}
MIB = 1024 * 1024

Answer = Callable[["Handler"], None]


class Hostile(ThreadingHTTPServer):
    answers: list[Answer]
    hits: int
    sent: int

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client that hung up on an attack is the point


class Handler(QuietHandler):
    server: Hostile

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.server.hits += 1
        answers = self.server.answers
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        with suppress(BrokenPipeError, ConnectionResetError):
            answer(self)

    def write(self, data: bytes) -> None:
        self.wfile.write(data)
        self.server.sent += len(data)


@contextmanager
def hostile(*answers: Answer) -> Iterator[Hostile]:
    server = Hostile(("127.0.0.1", 0), Handler)
    server.answers, server.hits, server.sent = list(answers), 0, 0
    with serving(server):
        yield server


def url(server: Hostile) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


def body(text: str | bytes, status: int = 200, headers: dict[str, str] | None = None) -> Answer:
    raw = text.encode() if isinstance(text, str) else text

    def answer(handler: Handler) -> None:
        handler.send_response(status)
        handler.send_header("content-type", "application/json")
        for name, value in (headers or {}).items():
            handler.send_header(name, value)
        handler.send_header("content-length", str(len(raw)))
        handler.end_headers()
        handler.write(raw)

    return answer


# --- what each vendor answers when it behaves -----------------------------------------------

CHAT: dict[str, Any] = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "m",
    "choices": [
        {
            "index": 0,
            "finish_reason": "stop",
            "message": {"role": "assistant", "content": "fine"},
        }
    ],
    "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12},
}
RESPONSES: dict[str, Any] = {
    "id": "resp_1",
    "object": "response",
    "status": "completed",
    "model": "m",
    "output": [
        {
            "type": "message",
            "id": "msg_1",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "fine", "annotations": []}],
        }
    ],
    "usage": {
        "input_tokens": 10,
        "output_tokens": 2,
        "total_tokens": 12,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": 0},
    },
}
ANTHROPIC: dict[str, Any] = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "claude-x",
    "content": [{"type": "text", "text": "fine"}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 10, "output_tokens": 2},
}
GOOD = {"chat": CHAT, "responses": RESPONSES, "anthropic": ANTHROPIC}


def transport(vendor: str, server: Hostile, **options: Any) -> Transport:
    if vendor == "chat":
        return OpenAIChatTransport("m", base_url=url(server) + "/v1", api_key=KEY, **options)
    if vendor == "responses":
        return OpenAIResponsesTransport("m", base_url=url(server) + "/v1", api_key=KEY, **options)
    if vendor == "own_client":  # a caller's own SDK client, handed to the transport
        sdk = openai.AsyncOpenAI(base_url=url(server) + "/v1", api_key=KEY)
        return OpenAIChatTransport("m", client=sdk, **options)
    return AnthropicTransport("claude-x", base_url=url(server), api_key=KEY, **options)


async def run(model: Transport, tools: list[Any] | None = None, **limits: Any) -> keel.RunResult:
    """One run to its end; an exception out of it fails the test, which is the point."""
    agent = keel.Agent(
        model, tools=tools or [], limits=keel.Limits(**{**FAST, **limits}), store=memory_store()
    )
    result = await agent.arun("What does the evidence say?")
    json.dumps(result.to_dict(), allow_nan=False)  # whatever happened, the result is JSON
    return result


def memory_store() -> keel.Store:
    return keel.Store(":memory:")


def errors_seen(result: keel.RunResult, store: keel.Store) -> list[ModelErrorSeen]:
    return [e for e in store.events(result.run_id) if isinstance(e, ModelErrorSeen)]


def mutated(vendor: str, path: str, value: Any) -> dict[str, Any]:
    """The vendor's good answer with the field at `path` (dots; digits index lists) replaced."""
    data = copy.deepcopy(GOOD[vendor])
    *parents, last = path.split(".")
    target: Any = data
    for part in parents:
        target = target[int(part)] if part.isdigit() else target[part]
    target[int(last) if last.isdigit() else last] = value
    return data


# --- fields of the wrong type ---------------------------------------------------------------

A_TOOL_NAMED_BY_AN_OBJECT = {
    "chat": (
        "choices.0.message.tool_calls",
        [{"id": "c1", "type": "function", "function": {"name": {"x": 1}, "arguments": "{}"}}],
        "choices[0].message.tool_calls[0].function.name",
    ),
    "responses": (
        "output",
        [{"type": "function_call", "call_id": "c1", "name": {"x": 1}, "arguments": "{}"}],
        "output[0].name",
    ),
    "anthropic": (
        "content",
        [{"type": "tool_use", "id": "toolu_1", "name": {"x": 1}, "input": {}}],
        "content[0].name",
    ),
}  # fmt: skip
WRONG_TYPES = {
    "finish_reason_object": {
        "chat": ("choices.0.finish_reason", {"x": 1}, "choices[0].finish_reason"),
        "responses": ("status", {"x": 1}, "status"),
        "anthropic": ("stop_reason", {"x": 1}, "stop_reason"),
    },
    "tool_name_object": A_TOOL_NAMED_BY_AN_OBJECT,
    "usage_string": {
        "chat": ("usage", "lots", "usage"),
        "responses": ("usage", "lots", "usage"),
        "anthropic": ("usage", "lots", "usage"),
    },
    "content_number": {
        "chat": ("choices.0.message.content", 42, "choices[0].message.content"),
        "responses": ("output.0.content", 42, "output[0].content"),
        "anthropic": ("content", 42, "content"),
    },
}


@pytest.mark.parametrize("vendor", ["chat", "responses", "anthropic"])
@pytest.mark.parametrize("defect", list(WRONG_TYPES))
async def test_a_field_of_the_wrong_type_ends_the_run_as_a_model_error_naming_it(
    vendor: str, defect: str
) -> None:
    path, value, named = WRONG_TYPES[defect][vendor]
    with hostile(body(json.dumps(mutated(vendor, path, value)))) as server:
        result = await run(transport(vendor, server))
    assert result.status == "failed" and result.failure is not None
    assert result.failure.kind == "ModelError"
    assert named in result.failure.message
    assert server.hits == 1  # not retried: the same server sends the same shape again
    assert result.usage == Usage()


# --- usage that is not a token count --------------------------------------------------------

USAGE_FIELD = {
    "chat": ("usage.prompt_tokens", "usage.prompt_tokens"),
    "responses": ("usage.input_tokens", "usage.input_tokens"),
    "anthropic": ("usage.input_tokens", "usage.input_tokens"),
}


@pytest.mark.parametrize("vendor", ["chat", "responses", "anthropic"])
@pytest.mark.parametrize("number", ["NaN", "-5", "1e400", "-Infinity", "3.5", "true"])
async def test_usage_that_is_not_a_finite_non_negative_integer_never_reaches_the_budgets(
    vendor: str, number: str
) -> None:
    path, named = USAGE_FIELD[vendor]
    text = json.dumps(mutated(vendor, path, 777_777_777)).replace("777777777", number)
    with hostile(body(text)) as server:
        result = await run(transport(vendor, server), max_tokens=1000)
    assert result.status == "failed" and result.failure is not None
    assert result.failure.kind == "ModelError"
    assert named in result.failure.message
    assert result.usage == Usage()


async def test_a_transport_of_your_own_cannot_put_nan_into_the_budgets() -> None:
    class Broken:
        name = "broken"

        async def request(self, request: ModelRequest) -> ModelResponse:
            return ModelResponse(text="hi", usage=Usage(float("nan"), -5))  # type: ignore[arg-type]

    result = await run(Broken(), model_retries=0)
    assert result.failure is not None and result.failure.kind == "ModelError"
    assert "usage" in result.failure.message and result.usage == Usage()


# --- a server that trickles -----------------------------------------------------------------


def trickle(handler: Handler) -> None:
    """Headers at once, then a byte every 0.2 s: every read succeeds, the answer never ends."""
    handler.send_response(200)
    handler.send_header("content-type", "application/json")
    handler.send_header("content-length", "100000")
    handler.end_headers()
    handler.write(b"{")
    for _ in range(500):
        time.sleep(0.2)
        handler.write(b" ")


@pytest.mark.parametrize("vendor", ["chat", "anthropic"])
async def test_a_trickling_server_is_cut_off_by_the_model_timeout_and_retried(
    vendor: str,
) -> None:
    assert keel.Limits().model_timeout == 600  # the documented default
    store = memory_store()
    with hostile(trickle) as server:
        agent = keel.Agent(
            transport(vendor, server),
            limits=keel.Limits(model_timeout=1.0, model_retries=1, **FAST),
            store=store,
        )
        started = time.monotonic()
        result = await agent.arun("q")
        elapsed = time.monotonic() - started
    assert result.failure is not None and result.failure.kind == "ModelError"
    assert "did not answer within 1.0s" in result.failure.message
    assert server.hits == 2  # a timeout is retryable: one retry, then the run fails
    assert [e.retryable for e in errors_seen(result, store)] == [True, True]
    assert elapsed < 10
    saved = store.get_run(result.run_id)
    assert saved is not None and saved.config.limits.model_timeout == 1.0  # recorded


async def test_the_runs_deadline_shortens_the_model_timeout() -> None:
    with hostile(trickle) as server:
        started = time.monotonic()
        result = await run(transport("chat", server), model_timeout=300, deadline=1.0)
    assert result.failure is not None and result.failure.kind == "DeadlineExceeded"
    assert time.monotonic() - started < 10


# --- answers far too large ------------------------------------------------------------------


def huge(size: int, declared: bool) -> Answer:
    """A chat completion whose text is `size` bytes, streamed in 64 KiB writes; without a
    declared length the body ends when the connection does (HTTP/1.0)."""
    head = b'{"id":"c","choices":[{"index":0,"message":{"role":"assistant","content":"'
    tail = b'"}}]}'

    def answer(handler: Handler) -> None:
        handler.send_response(200)
        handler.send_header("content-type", "application/json")
        if declared:
            handler.send_header("content-length", str(len(head) + size + len(tail)))
        handler.end_headers()
        handler.write(head)
        chunk = b"a" * (64 * 1024)
        for _ in range(size // len(chunk)):
            handler.write(chunk)
        handler.write(tail)

    return answer


@pytest.mark.parametrize("vendor", ["chat", "own_client", "anthropic"])
@pytest.mark.parametrize("declared", [False, True], ids=["streamed", "declared"])
async def test_an_oversized_answer_is_cut_off_while_it_streams_in(
    vendor: str, declared: bool
) -> None:
    with hostile(huge(64 * MIB, declared)) as server:
        result = await run(transport(vendor, server, max_response_bytes=MIB))
    assert result.failure is not None and result.failure.kind == "ModelError"
    assert "max_response_bytes" in result.failure.message
    assert server.hits == 1  # the same question would fetch the same answer
    assert server.sent < 16 * MIB  # the client stopped reading; nothing near 64 MiB went out


@pytest.fixture(scope="module")
def gzip_bomb() -> bytes:
    """128 MiB of JSON text, gzipped to about 130 KB."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    parts = [packer.compress(b'{"id":"c","choices":[{"message":{"content":"')]
    block = b"a" * MIB
    parts += [packer.compress(block) for _ in range(128)]
    parts += [packer.compress(b'"}}]}'), packer.flush()]
    return b"".join(parts)


@pytest.mark.parametrize("vendor", ["chat", "anthropic"])
async def test_a_gzip_bomb_is_cut_off_at_the_cap_counted_decompressed(
    vendor: str, gzip_bomb: bytes
) -> None:
    with hostile(body(gzip_bomb, headers={"content-encoding": "gzip"})) as server:
        model = transport(vendor, server, max_response_bytes=MIB)
        tracemalloc.start()
        try:
            result = await run(model)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert result.failure is not None and result.failure.kind == "ModelError"
    assert "max_response_bytes" in result.failure.message
    assert peak < 24 * MIB, f"{peak / MIB:.0f} MiB held for a 1 MiB cap"


def packed(data: bytes, coding: str) -> bytes:
    bits = {"gzip": 31, "deflate": 15, "raw-deflate": -15}[coding]
    packer = zlib.compressobj(6, zlib.DEFLATED, bits)
    return packer.compress(data) + packer.flush()


@pytest.mark.parametrize("vendor", ["chat", "anthropic"])
@pytest.mark.parametrize("coding", ["gzip", "deflate", "raw-deflate"])
async def test_compressed_answers_within_the_cap_are_decoded_as_they_stream_in(
    vendor: str, coding: str
) -> None:
    answer = mutated(vendor, "usage.output_tokens", 2)
    text = "a long answer " * 20_000  # 280 kB: many pieces of the bounded decoder
    if vendor == "chat":
        answer["choices"][0]["message"]["content"] = text
    else:
        answer["content"][0]["text"] = text
    encoding = "deflate" if coding == "raw-deflate" else coding
    compressed = packed(json.dumps(answer).encode(), coding)
    with hostile(body(compressed, headers={"content-encoding": encoding})) as server:
        result = await run(transport(vendor, server, max_response_bytes=MIB))
    assert result.status == "completed" and result.answer == text


@pytest.mark.parametrize("vendor", ["chat", "responses", "anthropic"])
async def test_an_error_message_of_megabytes_is_cut_to_max_error_chars(vendor: str) -> None:
    message = "overloaded " + "x" * (5 * MIB)
    if vendor == "anthropic":
        error = {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
    else:
        error = {"error": {"message": message, "type": "invalid_request_error", "code": None}}
    store = memory_store()
    with hostile(body(json.dumps(error), status=400)) as server:
        agent = keel.Agent(transport(vendor, server), limits=keel.Limits(**FAST), store=store)
        result = await agent.arun("q")
    assert result.failure is not None and result.failure.kind == "ModelError"
    assert "overloaded" in result.failure.message
    limit = keel.Limits().max_error_chars
    assert len(result.failure.message) < limit + 200
    assert all(len(e.message) < limit + 100 for e in errors_seen(result, store))


# --- numbers JSON cannot carry, and the JSON Keel prints -------------------------------------


def tool_call(arguments: str) -> str:
    call = {"id": "c1", "type": "function", "function": {"name": "note", "arguments": arguments}}
    return json.dumps(mutated("chat", "choices.0.message", {"content": None, "tool_calls": [call]}))


async def test_a_number_json_cannot_carry_in_tool_arguments_is_an_argument_error() -> None:
    @keel.tool(requires_approval=True)
    def note(n: float) -> str:
        """Write a note."""
        return str(n)

    with hostile(body(tool_call('{"n": 1e400}')), body(json.dumps(CHAT))) as server:
        result = await run(transport("chat", server), tools=[note])
    assert result.status == "completed"  # no approval asked for a call that cannot run
    assert result.pending_approvals == ()
    assert server.hits == 2


def test_a_run_stored_with_a_nan_before_this_fix_still_prints_as_json() -> None:
    assert json_text({"usage": {"input_tokens": float("nan")}, "x": [float("inf")]}) == (
        '{"usage": {"input_tokens": null}, "x": [null]}'
    )


def strict_json(text: str) -> Any:
    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_keel_run_and_keel_show_print_valid_json_whatever_usage_a_server_sends(
    tmp_path: Path,
) -> None:
    text = json.dumps(mutated("chat", "usage.prompt_tokens", 777_777_777))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KEEL", "OPENAI"))}
    env["HOME"] = str(tmp_path)
    store = str(tmp_path / "runs.sqlite")

    def keel_cli(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "keel", *args, "--store", store, "--json"]
        return subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)

    with hostile(body(text.replace("777777777", "NaN"))) as server:
        ran = keel_cli(
            "run", "q", "--model", "openai-chat:m", "--base-url", url(server) + "/v1",
            "--repo", str(tmp_path), "--max-model-calls", "2",
        )  # fmt: skip
    result = strict_json(ran.stdout)
    assert result["status"] == "failed" and result["failure"]["kind"] == "ModelError"
    shown = keel_cli("show", result["run_id"])
    assert shown.returncode == 0, shown.stderr
    strict_json(shown.stdout)
