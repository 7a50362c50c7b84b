"""What `keel serve` refuses before any handler reads a request (ADR 0047).

- **Another site's page.** A browser lets any page POST to any address, the loopback one too,
  without a preflight when the body is a "simple" one (`text/plain`, a form); it sends the
  page's `Origin` with it. The Host guard cannot see such a request (its Host is ours), and a
  token does not help a server without one. So every request that acts (any method but GET,
  HEAD and OPTIONS) carrying an `Origin` that is not this server's own (the scheme and the
  Host it was sent to) gets 403, and a body that is not `application/json` gets 415: no
  browser sends that cross-site without a preflight, which this server never answers
  favourably (it sends no CORS headers). Both hold with or without a token.
- **A body past 4 MiB** on the A2A routes (the AG-UI route caps its own): refused, the rest
  dropped without being kept, 413 with the binding's own error shape (a JSON-RPC error object on
  `/a2a/jsonrpc`, the REST error payload on `/a2a/rest`), before the SDK parses anything.
- **A body nested deeper than JSON's parser goes** on the A2A routes: refused, 400 with the
  binding's error shape (-32600), where the SDK's own parse ended in a RecursionError, an
  internal error and a traceback in the log (ADR 0062, N-SV09).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = [
    "MAX_BODY_BYTES",
    "SAFE_METHODS",
    "CrossSiteGuard",
    "headers_of",
    "read_bounded",
    "refusal",
    "refuse_too_large",
]

MAX_BODY_BYTES = 4 * 1024 * 1024
"""The largest A2A request body read, as AG-UI's (`serve/ag_ui.py`)."""
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
"""Methods that act on nothing here: a page elsewhere may send them, it cannot read answers."""
DRAIN_BYTES = 64 * 1024 * 1024
"""How much of a refused body is taken and dropped so its client reads the refusal."""
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
JSON = "application/json"


class CrossSiteGuard:
    """ASGI middleware: another site's Origin (403), a body not JSON (415), an A2A body too
    large (413). `capped`: whether a path's body is capped here, and how its refusal is worded."""

    def __init__(
        self, app: ASGIApp, capped: Callable[[str], str | None], limit: int = MAX_BODY_BYTES
    ) -> None:
        self.app = app
        self.capped = capped
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in SAFE_METHODS:
            await self.app(scope, receive, send)
            return
        headers = headers_of(scope)
        refused = refusal(scope, headers)
        if refused is not None:
            await _plain(send, *refused)
            return
        binding = self.capped(scope["path"])
        if binding is None:
            await self.app(scope, receive, send)
            return
        body = await read_bounded(receive, self.limit)
        if body is None:
            await refuse_too_large(send, binding, self.limit)
            return
        if _too_deep(body):
            message = "the request body is nested too deep for JSON's parser: send a flatter one"
            await _refuse_body(send, binding, 400, message)
            return
        await self.app(scope, replay_body(body, receive), send)


def refusal(scope: Scope, headers: dict[str, str]) -> tuple[int, str] | None:
    """Why a request that acts is refused (its status and message), or None: another site's
    `Origin` (403), a body not JSON (415)."""
    origin = headers.get("origin")
    if origin is not None and origin.lower() != own_origin(scope, headers):
        return 403, f"refused: a request from {origin[:200]} (another site)"
    media = headers.get("content-type", "").split(";")[0].strip().lower()
    if scope["method"] in BODY_METHODS and media != JSON:
        return 415, f"refused: send the body as {JSON} (it was {(media or 'none')[:100]})"
    return None


def own_origin(scope: Scope, headers: dict[str, str]) -> str:
    """The origin a page of this server would send: the scheme and the Host asked for."""
    scheme = str(scope.get("scheme") or "http")
    return f"{scheme}://{headers.get('host', '')}".lower()


def headers_of(scope: Scope) -> dict[str, str]:
    """The request's headers by lower-case name (the first of each)."""
    found: dict[str, str] = {}
    for key, value in scope.get("headers", []):
        found.setdefault(bytes(key).decode("latin-1").lower(), bytes(value).decode("latin-1"))
    return found


async def read_bounded(receive: Receive, limit: int) -> bytes | None:
    """The whole body, or None once it is past `limit`: the rest is then taken and dropped
    (up to DRAIN_BYTES, nothing kept), so the client, still sending, reads the refusal instead
    of a connection reset."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":  # the client went away: nothing more comes
            break
        chunk = bytes(message.get("body", b""))
        size += len(chunk)
        more = bool(message.get("more_body", False))
        if size > limit:
            chunks.clear()
            while more and size <= limit + DRAIN_BYTES:
                message = await receive()
                size += len(message.get("body", b""))
                more = message["type"] == "http.request" and bool(message.get("more_body"))
            return None
        chunks.append(chunk)
        if not more:
            break
    return b"".join(chunks)


def replay_body(body: bytes, receive: Receive) -> Receive:
    """A receive that gives the body read once, then what the connection says (a disconnect)."""
    given = False

    async def again() -> Message:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again


def _too_deep(body: bytes) -> bool:
    """Whether JSON's parser would give up on `body` with a RecursionError (looked at only
    when it holds enough brackets to nest that deep)."""
    if body.count(b"[") + body.count(b"{") < 500:
        return False
    try:
        json.loads(body)
    except RecursionError:
        return True
    except ValueError:  # not JSON at all: the SDK says so in its own words
        return False
    return False


async def refuse_too_large(send: Send, binding: str, limit: int) -> None:
    message = (
        f"the request body is larger than {limit} bytes ({limit // (1024 * 1024)} MiB): "
        "send a shorter message"
    )
    await _refuse_body(send, binding, 413, message)


async def _refuse_body(send: Send, binding: str, status: int, message: str) -> None:
    payload: dict[str, Any]
    if binding == "jsonrpc":  # -32600: Invalid Request, as the SDK's own 'Payload too large'
        payload = {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": message}}
    else:
        payload = {"error": {"code": status, "status": "INVALID_ARGUMENT", "message": message}}
    await _send(send, status, JSON, json.dumps(payload).encode())


async def _plain(send: Send, status: int, text: str) -> None:
    await _send(send, status, "text/plain; charset=utf-8", (text + "\n").encode())


async def _send(send: Send, status: int, media: str, body: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", media.encode()), (b"connection", b"close")],
        }
    )
    await send({"type": "http.response.body", "body": body})
