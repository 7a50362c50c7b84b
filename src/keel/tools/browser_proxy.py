"""A loopback HTTP proxy that puts the host guard in front of every request a browser makes.

The HTTP tools check each redirect hop themselves. A browser follows redirects, loads frames,
scripts and images, and runs page JavaScript that fetches and opens WebSockets, all on its own;
Playwright's request interception does not even see the hops of a redirect. So the browser is
started with this proxy as its only way out (loopback included), and the proxy applies the
host guard to each request it is asked to carry: plain HTTP by its absolute URL, HTTPS and WSS
by the host and port of the CONNECT tunnel. A refused request gets a 403 whose body is the
guard's sentence, and the refusal is remembered for the tool to report.

Each proxied request uses a fresh upstream connection (`keel.tools.pinned.open_pinned`): the
host is looked up once, every address checked, and the connection made to a checked address,
so DNS rebinding cannot slip a loopback address in between. The browser's own Host header and
TLS (end to end, inside the tunnel) keep the name. Each connection is closed after its response
(``Connection: close``), which keeps the proxy a byte pipe with no HTTP state machine. WebSocket
upgrades pass through as they are.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Collection
from urllib.parse import urlsplit

from keel.tools.netguard import HostRefused, Resolver, vet_url
from keel.tools.pinned import open_pinned

__all__ = ["CONNECT_TIMEOUT", "REFUSED_HEADER", "GuardProxy"]

CONNECT_TIMEOUT = 10.0
_HOP_HEADERS = frozenset(
    {b"proxy-connection", b"proxy-authorization", b"keep-alive", b"connection"}
)
REFUSED_HEADER = "X-Keel-Refused"


class GuardProxy:
    """Start with `start()` (returns the proxy URL), stop with `close()`."""

    def __init__(self, allow_hosts: Collection[str], resolver: Resolver | None = None) -> None:
        self.allow_hosts = tuple(allow_hosts)
        self.resolver = resolver
        self._refusals: dict[str, str] = {}
        """host:port -> the guard's last refusal for it."""
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def refusal_for(self, url: str) -> str | None:
        """Why a request to `url`'s host and port was refused, if it was."""
        return self._refusals.get(_origin(url))

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.ensure_future(self._serve(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            writer.close()
            return
        try:
            request_line, _, rest = head.partition(b"\r\n")
            method, target, _version = request_line.decode("latin-1").split(" ", 2)
            if method.upper() == "CONNECT":
                await self._tunnel(target, reader, writer)
            else:
                await self._forward(method, target, rest, reader, writer)
        except (ValueError, ConnectionError, OSError, TimeoutError):
            pass
        finally:
            writer.close()

    async def _connect(
        self, writer: asyncio.StreamWriter, url: str, host: str, port: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """The upstream connection, to the address the guard checked; None after a 403."""
        refused = vet_url(url, self.allow_hosts)
        if refused is None:
            try:
                return await open_pinned(
                    host, port, self.allow_hosts, self.resolver, CONNECT_TIMEOUT
                )
            except HostRefused as exc:
                refused = exc.sentence(url)
        await self._refuse(writer, url, refused)
        return None

    async def _refuse(self, writer: asyncio.StreamWriter, url: str, refused: str) -> None:
        """Answer 403 with the guard's sentence, and remember it for the tool."""
        self._refusals[_origin(url)] = refused
        body = refused.encode("utf-8")
        writer.write(
            b"HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain; charset=utf-8\r\n"
            + f"{REFUSED_HEADER}: 1\r\nContent-Length: {len(body)}\r\n".encode()
            + b"Connection: close\r\n\r\n"
            + body
        )
        await writer.drain()

    async def _tunnel(
        self, target: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        host, _, port = target.rpartition(":")
        url = f"https://{host}:{port}/"
        upstream = await self._connect(writer, url, host.strip("[]"), int(port))
        if upstream is None:
            return
        up_reader, up_writer = upstream
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await writer.drain()
        await _splice(reader, writer, up_reader, up_writer)

    async def _forward(
        self,
        method: str,
        target: str,
        header_block: bytes,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        parts = urlsplit(target)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        upstream = await self._connect(writer, target, parts.hostname or "", port)
        if upstream is None:
            return
        up_reader, up_writer = upstream
        upgrade = False
        headers: list[bytes] = []
        for line in header_block.split(b"\r\n"):
            if not line:
                continue
            name, _, value = line.partition(b":")
            lowered = name.strip().lower()
            if lowered == b"connection" and b"upgrade" in value.lower():
                upgrade = True
            if lowered not in _HOP_HEADERS:
                headers.append(line)
        headers.append(b"Connection: upgrade" if upgrade else b"Connection: close")
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        up_writer.write(
            f"{method} {path} HTTP/1.1\r\n".encode("latin-1") + b"\r\n".join(headers) + b"\r\n\r\n"
        )
        await up_writer.drain()
        if not upgrade:
            await _relay_response_head(up_reader, writer)
        await _splice(reader, writer, up_reader, up_writer)


def _origin(url: str) -> str:
    """``host:port`` of a URL, the key refusals are remembered by."""
    try:
        parts = urlsplit(url)
        port = parts.port or {"https": 443, "wss": 443}.get(parts.scheme, 80)
    except ValueError:
        return url
    return f"{(parts.hostname or '').lower()}:{port}"


async def _relay_response_head(up: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Pass the response head on, saying the connection closes after this response."""
    head = await up.readuntil(b"\r\n\r\n")
    lines = [
        line
        for line in head[:-4].split(b"\r\n")
        if line.partition(b":")[0].strip().lower() not in _HOP_HEADERS
    ]
    writer.write(b"\r\n".join([*lines, b"Connection: close"]) + b"\r\n\r\n")
    await writer.drain()


async def _splice(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    up_reader: asyncio.StreamReader,
    up_writer: asyncio.StreamWriter,
) -> None:
    """Copy both ways until either side is done (browsers do not half-close), then drop both."""
    download = asyncio.ensure_future(_copy(up_reader, writer))
    upload = asyncio.ensure_future(_copy(reader, up_writer))
    try:
        await asyncio.wait({download, upload}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (download, upload):
            task.cancel()
        await asyncio.gather(download, upload, return_exceptions=True)
        up_writer.close()


async def _copy(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        while data := await source.read(65536):
            sink.write(data)
            await sink.drain()
