"""The pinned connection (`keel.tools.pinned`) still speaks to the name: the resolver Keel is
given is the one asked, once, and the Host header, TLS SNI and certificate check are the URL's."""

from __future__ import annotations

import asyncio
import ipaddress
import ssl
from collections.abc import Sequence

import httpx
import pytest
import trustme

from keel.messages import ToolCall
from keel.tools.executor import ToolExecutor
from keel.tools.netguard import IPAddress
from keel.tools.pinned import GuardedTransport, default_ssl_context
from keel.tools.web import web_tools
from netattack import LOOPBACK, CountingServer


class FixedResolver:
    """A resolver (Keel's injection point) answering from a table, keeping what it was asked."""

    def __init__(self, table: dict[str, list[str]]) -> None:
        self.table = table
        self.asked: list[str] = []

    async def __call__(self, host: str) -> Sequence[IPAddress]:
        self.asked.append(host)
        return [ipaddress.ip_address(text) for text in self.table[host]]


async def test_fetch_uses_the_injected_resolver_and_keeps_the_host_header() -> None:
    resolver = FixedResolver({"docs.test": [LOOPBACK]})
    tools = web_tools(allow_hosts=["docs.test"], resolver=resolver)
    with CountingServer() as server:
        url = f"http://docs.test:{server.port}/page"
        (executed,) = await ToolExecutor(tools).run_batch(
            [ToolCall.from_arguments("w1", "fetch", {"url": url})]
        )
    assert not executed.result.is_error, executed.result.content
    assert "loopback secret" in executed.result.content
    assert resolver.asked == ["docs.test"]
    assert f"host: docs.test:{server.port}\r\n".encode() in server.heads[0].lower()


async def test_a_pinned_https_connection_keeps_the_name_for_sni_and_the_certificate() -> None:
    ca = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("app.test").configure_cert(server_context)
    sni: list[str | None] = []
    server_context.sni_callback = lambda _sock, name, _ctx: sni.append(name)

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
            return
        host = next(
            line.split(b":", 1)[1].strip()
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"host:")
        )
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(host), host))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, LOOPBACK, 0, ssl=server_context)
    port = server.sockets[0].getsockname()[1]
    client_context = ssl.create_default_context()
    ca.configure_trust(client_context)
    resolver = FixedResolver({"app.test": [LOOPBACK], "other.test": [LOOPBACK]})
    transport = GuardedTransport(["app.test", "other.test"], resolver, ssl_context=client_context)
    try:
        async with httpx.AsyncClient(transport=transport) as client:
            response = await client.get(f"https://app.test:{port}/")
            assert (response.status_code, response.text) == (200, f"app.test:{port}")
            assert sni == ["app.test"]
            # Same address, another name: the certificate is checked against the name.
            with pytest.raises(httpx.ConnectError, match=r"certificate|hostname"):
                await client.get(f"https://other.test:{port}/")
    finally:
        server.close()
        await server.wait_closed()
    assert resolver.asked == ["app.test", "other.test"]


def test_the_default_tls_context_is_built_once_and_verifies() -> None:
    """Loading certifi's roots cost ~15 ms of CPU per fetch; one context serves every client,
    and sharing it must not loosen it."""
    first, second = GuardedTransport(), GuardedTransport(["example.test"])
    assert first.ssl_context is second.ssl_context is default_ssl_context()
    assert first.ssl_context.verify_mode == ssl.CERT_REQUIRED
    assert first.ssl_context.check_hostname
