"""Connections made to the address the host guard checked, for httpx and for plain streams.

The guard (`keel.tools.netguard`) is only as good as the link between its answer and the
socket: when the check and the connection resolve a name separately, a DNS server can answer a
public address to the first and 127.0.0.1 to the second (DNS rebinding). Here the two are one
step. `resolve_checked` looks the host up once and judges every address; the socket is then
opened to one of those addresses, by number, so nothing on the way resolves the name again.

- `GuardedTransport` is an httpx transport whose connection pool uses `PinnedBackend`: httpcore
  hands it the URL's host and port for each new connection, and it connects to the checked
  address. The name stays the URL's, so the Host header, TLS SNI and certificate verification
  are those of the host the model asked for, as with any other client.
- `open_pinned` is the same for `asyncio` streams (the browser's guard proxy).

A refused host raises `HostRefused` out of the request; a host whose checked addresses all fail
to connect raises the last connection error, as an unpinned client would.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
from collections.abc import Collection, Iterable
from typing import Any

import httpcore
import httpx

from keel.tools.netguard import IPAddress, Resolver, resolve_checked

__all__ = ["GuardedTransport", "PinnedBackend", "default_ssl_context", "open_pinned"]


class PinnedBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend, with the guard between the host name and the socket."""

    def __init__(self, allow_hosts: Collection[str], resolver: Resolver | None = None) -> None:
        self.allow_hosts = tuple(allow_hosts)
        self.resolver = resolver
        self._sockets = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        addresses = await resolve_checked(host, port, self.allow_hosts, self.resolver)
        failures: list[Exception] = []
        for address in addresses:
            try:
                return await self._sockets.connect_tcp(
                    _numeric(address), port, timeout, local_address, socket_options
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                failures.append(exc)
        raise failures[-1]

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("web tools connect over TCP only")

    async def sleep(self, seconds: float) -> None:
        await self._sockets.sleep(seconds)


class GuardedTransport(httpx.AsyncHTTPTransport):
    """An httpx transport that connects only where the guard allows, to the address it checked.

    No proxy (a proxy would resolve the name itself) and no environment settings. `ssl_context`
    defaults to httpx's (certifi's roots, `default_ssl_context`); pass one to trust another
    authority.
    """

    def __init__(
        self,
        allow_hosts: Collection[str] = (),
        resolver: Resolver | None = None,
        *,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        context = ssl_context if ssl_context is not None else default_ssl_context()
        super().__init__(verify=context, trust_env=False)
        self.ssl_context = context
        self.backend = PinnedBackend(allow_hosts, resolver)
        # httpx builds its pool without a way to pass a network backend; this is the same pool
        # (httpx's default limits) on the pinned backend. The rebinding tests fail if a later
        # httpx stops using `_pool`.
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=context,
            max_connections=100,
            max_keepalive_connections=20,
            keepalive_expiry=5.0,
            network_backend=self.backend,
        )


@functools.cache
def default_ssl_context() -> ssl.SSLContext:
    """httpx's default TLS settings, built once per process: loading certifi's roots costs some
    15 ms of CPU, more than all the rest of a fetch on loopback, and a client is made per call."""
    return httpx.create_ssl_context(trust_env=False)


async def open_pinned(
    host: str,
    port: int,
    allow_hosts: Collection[str],
    resolver: Resolver | None = None,
    timeout: float = 10.0,
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """`asyncio.open_connection` to the checked address of `host` (HostRefused if refused)."""
    addresses = await resolve_checked(host, port, allow_hosts, resolver)
    failures: list[OSError] = []
    for address in addresses:
        try:
            return await asyncio.wait_for(asyncio.open_connection(_numeric(address), port), timeout)
        except OSError as exc:  # TimeoutError included
            failures.append(exc)
    raise failures[-1]


def _numeric(address: IPAddress) -> str:
    """The address as the socket layer takes it (no lookup: a literal needs none)."""
    return str(address)
