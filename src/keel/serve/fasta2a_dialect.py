"""fasta2a's A2A, answered so its client reads it (ADR 0065).

fasta2a (pydantic's A2A library) speaks a mix of the two versions Keel serves: its client sends
A2A 0.3 method names (`message/send`, `message/stream`, `tasks/get`, no `A2A-Version` header),
but reads a send's result in 1.0's wrapper (`{"task": {...}}` or `{"message": {...}}`) and a
stream's events as 1.0's `StreamResponse` (`{"task"|"message"|"statusUpdate"|"artifactUpdate":
...}`). A 0.3 answer (the task itself, marked by `kind`) it validates to `{}`: it never read an
answer. And its `tasks/get` carries `"id": null`, which JSON-RPC allows and the SDK's 0.3 layer
refused with -32600.

Its client posts to the card's URL with "/" after it (`/a2a/jsonrpc/`), a path only it uses:
there, a 0.3 request's result (JSON, or each event of a stream) is wrapped under the key its
`kind` names, and nothing else changes (the task inside is the 0.3 task, whose extra fields
fasta2a ignores). On both JSON-RPC paths a 0.3 request whose id is null is answered, with a
null id. The body is the one `doors.CrossSiteGuard` already read and capped.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from keel.serve.doors import (
    MAX_BODY_BYTES,
    headers_of,
    read_bounded,
    refuse_too_large,
    replay_body,
)

__all__ = ["Fasta2aDialect", "wrapped"]

V03_METHODS = frozenset(
    {"message/send", "message/stream", "tasks/get", "tasks/cancel", "tasks/resubscribe"}
)
"""The 0.3 methods fasta2a's client sends (and `tasks/resubscribe`, a stream like its own)."""
WRAPPED_METHODS = frozenset({"message/send", "message/stream", "tasks/resubscribe"})
"""Whose results fasta2a reads wrapped (`tasks/get` and `tasks/cancel`: the task, as in 0.3)."""
WRAPPER_KEYS = {
    "task": "task",
    "message": "message",
    "status-update": "statusUpdate",
    "artifact-update": "artifactUpdate",
}
"""A 0.3 result's `kind`, and the 1.0 key fasta2a reads it under."""
NULL_ID = "keel-null-id"
"""Stands in for a request's null id on its way through the SDK, and is null again after."""


def wrapped(answer: Any, null_id: bool, wrap: bool) -> Any:
    """A JSON-RPC answer as fasta2a reads it: the id null again when the request's was, the
    result under the key its `kind` names when `wrap`."""
    if not isinstance(answer, dict):
        return answer
    if null_id and answer.get("id") == NULL_ID:
        answer["id"] = None
    result = answer.get("result")
    if wrap and isinstance(result, dict) and result.get("kind") in WRAPPER_KEYS:
        answer["result"] = {WRAPPER_KEYS[result["kind"]]: result}
    return answer


class Fasta2aDialect:
    """ASGI middleware on the JSON-RPC paths: `fasta2a_path` gets fasta2a's wrapping, every
    path in `paths` a 0.3 request's null id answered."""

    def __init__(self, app: ASGIApp, paths: frozenset[str], fasta2a_path: str) -> None:
        self.app = app
        self.paths = paths
        self.fasta2a_path = fasta2a_path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in self.paths:
            await self.app(scope, receive, send)
            return
        body = await read_bounded(receive, MAX_BODY_BYTES)
        if body is None:  # the guards in front bound it too; this one holds on its own
            await refuse_too_large(send, "jsonrpc", MAX_BODY_BYTES)
            return
        request = _request(body)
        if request is None or "a2a-version" in headers_of(scope):
            await self.app(scope, replay_body(body, receive), send)
            return
        null_id = "id" in request and request["id"] is None
        if null_id:
            request["id"] = NULL_ID
            body = json.dumps(request).encode()
        wrap = scope["path"] == self.fasta2a_path and request["method"] in WRAPPED_METHODS
        if not (null_id or wrap):
            await self.app(scope, replay_body(body, receive), send)
            return
        rewrite = lambda answer: wrapped(answer, null_id, wrap)  # noqa: E731
        await self.app(scope, replay_body(body, receive), _Rewriting(send, rewrite))


def _request(body: bytes) -> dict[str, Any] | None:
    """A 0.3 JSON-RPC request object, or None for anything else (left to the SDK to judge)."""
    try:
        request = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if isinstance(request, dict) and request.get("method") in V03_METHODS:
        return request
    return None


class _Rewriting:
    """The response, each JSON-RPC answer in it rewritten: a JSON body whole, an event stream
    line by line (`data: {...}`) as it is sent."""

    def __init__(self, send: Send, rewrite: Callable[[Any], Any]) -> None:
        self.send = send
        self.rewrite = rewrite
        self.streaming = False
        self.start: Message | None = None
        self.kept: list[bytes] = []
        self.partial = b""

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            media = dict(message.get("headers", [])).get(b"content-type", b"")
            self.streaming = media.startswith(b"text/event-stream")
            if self.streaming:
                await self.send(message)
            else:
                self.start = message  # sent with the rewritten body's length
            return
        if message["type"] != "http.response.body":
            await self.send(message)
            return
        chunk, more = bytes(message.get("body", b"")), bool(message.get("more_body", False))
        if self.streaming:
            await self.send({**message, "body": self._lines(chunk, final=not more)})
            return
        self.kept.append(chunk)
        if not more:
            await self._send_whole()

    def _lines(self, chunk: bytes, *, final: bool) -> bytes:
        text = self.partial + chunk
        lines = text.split(b"\n")
        self.partial = b"" if final else lines.pop()
        out = [self._line(line) for line in lines]
        return b"\n".join(out) + (b"" if final else b"\n" if out else b"")

    def _line(self, line: bytes) -> bytes:
        if not line.startswith(b"data:"):
            return line
        try:
            answer = json.loads(line[5:])
        except (ValueError, RecursionError):
            return line
        return b"data: " + json.dumps(self.rewrite(answer)).encode()

    async def _send_whole(self) -> None:
        body = b"".join(self.kept)
        with contextlib.suppress(ValueError, RecursionError):  # not JSON: sent as it came
            body = json.dumps(self.rewrite(json.loads(body))).encode()
        start = self.start or {"type": "http.response.start", "status": 200, "headers": []}
        headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        await self.send({**start, "headers": headers})
        await self.send({"type": "http.response.body", "body": body, "more_body": False})
