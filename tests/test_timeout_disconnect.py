"""Keel's model timeout hangs up (ADR 0065): when an attempt is given up, the HTTP connection it
was made on is closed at once, so a server that stops when its client leaves (llama-cpp-python's
server checks between streamed chunks) stops generating, and a server that serves one request at
a time is free for the next. Observed from a loopback server that records when each
connection's client went away."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from keel._run.gateway import attempt
from keel.errors import ProviderError
from keel.limits import Limits
from keel.messages import ModelRequest, UserMessage
from keel.transports.openai_chat import OpenAIChatTransport

TIMEOUT = 0.5
"""The attempt's model timeout, seconds."""
HANG_UP_WITHIN = 1.0
"""How soon after the timeout the server must see its client gone."""


class Stalling:
    """A chat-completions server that reads a request, then sends nothing (or, for a streamed
    one, one chunk) and waits: `gone` is when its client closed the connection."""

    def __init__(self) -> None:
        self.gone: list[float] = []
        self.bodies: list[dict[str, object]] = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            data += conn.recv(65536)
        head, _, body = data.partition(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1]) for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        )  # fmt: skip
        while len(body) < length:
            body += conn.recv(65536)
        sent = json.loads(body)
        self.bodies.append(sent)
        if sent.get("stream"):
            chunk = {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "m",
                     "choices": [{"index": 0, "delta": {"content": "Thinking"}}]}  # fmt: skip
            conn.sendall(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"transfer-encoding: chunked\r\n\r\n"
            )
            event = f"data: {json.dumps(chunk)}\n\n".encode()
            conn.sendall(f"{len(event):x}\r\n".encode() + event + b"\r\n")
        conn.settimeout(30)
        try:
            while conn.recv(4096):  # the client has nothing more to send: b"" is its close
                pass
        except OSError:
            pass
        self.gone.append(time.monotonic())
        conn.close()


@contextmanager
def stalling() -> Iterator[Stalling]:
    server = Stalling()
    threading.Thread(target=server.serve, daemon=True).start()
    try:
        yield server
    finally:
        server.sock.close()


def _request() -> ModelRequest:
    return ModelRequest(system="Answer.", tools=(), items=(UserMessage("Say something."),))


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
async def test_a_timed_out_attempt_closes_its_connection(streamed: bool) -> None:
    with stalling() as server:
        transport = OpenAIChatTransport("m", base_url=server.url, api_key="k")

        class Streamed:  # the gateway's view of a streamed attempt (ADR 0039)
            async def request(self, request: ModelRequest) -> object:
                return await transport.request_streaming(request, lambda _text: None)

        model = Streamed() if streamed else transport
        with pytest.raises(ProviderError, match=r"did not answer|no token"):
            await attempt(model, _request(), Limits(model_timeout=TIMEOUT), None)  # type: ignore[arg-type]
        gave_up = time.monotonic()
        for _ in range(int(HANG_UP_WITHIN / 0.05)):
            if server.gone:
                break
            await asyncio.sleep(0.05)
        assert server.bodies, "the request never reached the server"
        assert server.gone, f"the connection was still open {HANG_UP_WITHIN}s after the timeout"
        assert server.gone[0] - gave_up < HANG_UP_WITHIN
