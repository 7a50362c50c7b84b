"""What the network-attack tests need: a resolver the test controls, a loopback server that
counts every connection, and a fence that keeps the process from reaching any other address.

The rebinding tests make the code under test believe a name is public, so a correct client
tries to connect to that public address. The fence (a `sys.audit` hook on ``socket.connect``)
refuses every connection to a non-loopback address while it is up, as a firewall would, and
records each attempt, so a test can say where a connection went without any packet leaving the
machine. It is installed on first use and does nothing while no fence is up.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

__all__ = [
    "LOOPBACK",
    "PUBLIC",
    "CountingServer",
    "Fence",
    "RebindingDNS",
    "fence",
    "proxy_exchange",
]

PUBLIC = "93.184.216.34"
"""A public address; the fence keeps every connection to it from leaving the machine."""
LOOPBACK = "127.0.0.1"

_real_getaddrinfo = socket.getaddrinfo


class RebindingDNS:
    """A `socket.getaddrinfo` whose answers for some names change from one lookup to the next,
    like a hostile DNS server with a zero TTL: the n-th lookup of a name gets its n-th answer
    (the last one repeats). Other names go to the real resolver."""

    def __init__(self, answers: dict[str, list[list[str]]]) -> None:
        self.answers = answers
        self.lookups = dict.fromkeys(answers, 0)
        self._lock = threading.Lock()

    def __call__(
        self, host: Any, port: Any, family: int = 0, type: int = 0, proto: int = 0, flags: int = 0
    ) -> list[Any]:
        name = host.decode("ascii") if isinstance(host, bytes) else host
        if name not in self.answers:
            return _real_getaddrinfo(host, port, family, type, proto, flags)
        with self._lock:
            n = self.lookups[name]
            self.lookups[name] = n + 1
        answer = self.answers[name][min(n, len(self.answers[name]) - 1)]
        number = int(port) if port else 0
        infos: list[Any] = []
        for text in answer:
            if ipaddress.ip_address(text).version == 6:
                if family in (0, socket.AF_INET6):
                    infos.append((socket.AF_INET6, socket.SOCK_STREAM, 6, "", (text, number, 0, 0)))
            elif family in (0, socket.AF_INET):
                infos.append((socket.AF_INET, socket.SOCK_STREAM, 6, "", (text, number)))
        return infos


class CountingServer:
    """A loopback TCP server that counts every connection it accepts and keeps what each one
    sent first; it answers any of them with a small HTTP page saying "loopback secret"."""

    BODY = b"loopback secret"

    def __init__(self) -> None:
        self._socket = socket.create_server((LOOPBACK, 0))
        self._socket.settimeout(0.2)
        self.port: int = self._socket.getsockname()[1]
        self.heads: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="counting-server", daemon=True)

    @property
    def hits(self) -> int:
        return len(self.heads)

    def __enter__(self) -> CountingServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self._socket.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._socket.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(2)
                head = b""
                try:
                    while b"\r\n\r\n" not in head and len(head) < 65536:
                        chunk = conn.recv(4096)
                        if not chunk:
                            break
                        head += chunk
                except OSError:
                    pass
                self.heads.append(head)
                response = (
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                    + f"Content-Length: {len(self.BODY)}\r\nConnection: close\r\n\r\n".encode()
                    + self.BODY
                )
                with suppress(OSError):
                    conn.sendall(response)


async def proxy_exchange(proxy_url: str, request: bytes) -> bytes:
    """Send one raw request to the proxy and read what comes back until it closes."""
    host, port = proxy_url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(request)
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(65536), 10)
    finally:
        writer.close()


class Fence:
    """The connection attempts made while the fence was up, as (host, port)."""

    def __init__(self) -> None:
        self.attempts: list[tuple[str, int]] = []

    def outside(self) -> list[tuple[str, int]]:
        """The attempts to non-loopback addresses (each one refused)."""
        return [(host, port) for host, port in self.attempts if not _is_loopback(host)]


_fences: list[Fence] = []
_installed = threading.Lock()
_hook_added = False


@contextmanager
def fence() -> Iterator[Fence]:
    """Refuse, and record, every connection to a non-loopback address while in the block."""
    global _hook_added
    with _installed:
        if not _hook_added:
            sys.addaudithook(_audit)
            _hook_added = True
    current = Fence()
    _fences.append(current)
    try:
        yield current
    finally:
        _fences.remove(current)


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event != "socket.connect" or not _fences:
        return
    address = args[1]
    if not isinstance(address, tuple):
        return  # a Unix socket
    host, port = str(address[0]), int(address[1])
    for current in _fences:
        current.attempts.append((host, port))
    if not _is_loopback(host):
        raise ConnectionRefusedError(
            errno.ECONNREFUSED, f"fenced: tests never connect to {host}:{port}"
        )


def _is_loopback(host: str) -> bool:
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback
