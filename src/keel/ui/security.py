"""What keeps the web view the user's own: the Host guard, the CSRF token, and the headers.

- Host guard: every request (pages too, not only forms) whose `Host` is not one this server
  answers to is refused with 403 before any handler runs. A page on another site can make the
  browser send requests to 127.0.0.1 (DNS rebinding gives it a name that resolves there); such
  requests carry that site's host name, so they read nothing and decide nothing.
- CSRF: every form carries a token drawn at start-up; a POST without it (or with an `Origin`
  that is not ours) is refused with 403 before the store is opened for writing.
- Headers: a content security policy that allows only this server's own script and style (no
  inline script, so escaped text can never run), no framing, no sniffing, and no referrer to
  other sites (a same-origin one: under `no-referrer` a browser sends a form's `Origin` as
  `null`, which the Origin check would refuse).
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
import socket
from collections.abc import Collection, Mapping
from urllib.parse import parse_qs

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = [
    "MAX_FORM_BYTES",
    "FormError",
    "Guard",
    "is_loopback",
    "new_token",
    "parse_form",
    "served_hosts",
    "token_matches",
]

MAX_FORM_BYTES = 16_384
HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        b"connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
]


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _name(host: str) -> str:
    """A host as it appears in a Host header: IPv6 addresses in brackets, lower case."""
    host = host.strip("[]").lower()
    return f"[{host}]" if ":" in host else host


def served_hosts(host: str, port: int) -> frozenset[str]:
    """The Host header values this server answers to, bound to `host` on `port`.

    Loopback: the loopback names. A wildcard (0.0.0.0, ::): also this machine's name and its
    addresses. Any other address or name: itself (and what a name resolves to)."""
    names = {_name(host)}
    if is_loopback(host) or host in ("0.0.0.0", "::", ""):
        names |= {"localhost", "127.0.0.1", "[::1]"}
    if host in ("0.0.0.0", "::", ""):
        machine = socket.gethostname()
        names |= {_name(machine), _name(socket.getfqdn())}
        names |= _addresses(machine)
    elif not is_loopback(host):
        names |= _addresses(host)
    with_port = {f"{n}:{port}" for n in names}
    return frozenset(with_port | (names if port == 80 else set()))


def _addresses(name: str) -> set[str]:
    try:
        infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except OSError:
        return set()
    return {_name(str(info[4][0])) for info in infos}


class Guard:
    """ASGI middleware: the Host guard, and the security headers on every response."""

    def __init__(self, app: ASGIApp, hosts: Collection[str]) -> None:
        self.app = app
        self.hosts = frozenset(h.lower() for h in hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        host = _header(scope, b"host").lower()
        if host not in self.hosts:
            await _refuse(send, b"refused: this server does not answer to that Host\n")
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *HEADERS]
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _header(scope: Scope, name: bytes) -> str:
    for key, value in scope.get("headers", []):
        if key == name:
            return bytes(value).decode("latin-1")
    return ""


async def _refuse(send: Send, body: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 403,
            "headers": [(b"content-type", b"text/plain; charset=utf-8"), *HEADERS],
        }
    )
    await send({"type": "http.response.body", "body": body})


def new_token() -> str:
    return secrets.token_urlsafe(32)


def token_matches(expected: str, given: str | None) -> bool:
    return given is not None and hmac.compare_digest(expected.encode(), given.encode())


class FormError(Exception):
    """A form that cannot be read: its status code and message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def parse_form(content_type: str, body: bytes) -> Mapping[str, str]:
    """A urlencoded form's fields (the first value of each); no multipart, no files."""
    if content_type.split(";")[0].strip().lower() != "application/x-www-form-urlencoded":
        raise FormError(415, "send the form as application/x-www-form-urlencoded")
    if len(body) > MAX_FORM_BYTES:
        raise FormError(413, f"the form is larger than {MAX_FORM_BYTES} bytes")
    try:
        fields = parse_qs(body.decode("utf-8"), keep_blank_values=True, max_num_fields=20)
    except (UnicodeDecodeError, ValueError) as exc:
        raise FormError(400, f"the form cannot be read: {exc}") from None
    return {k: v[0] for k, v in fields.items()}
