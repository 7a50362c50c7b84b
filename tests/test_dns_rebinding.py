"""DNS rebinding, written as the attack: a name whose answers change between lookups must never
bring `fetch`, `observe_page` or the browser (through its guard proxy) to a loopback server.

The resolver is `socket.getaddrinfo`, replaced by one the test controls (`RebindingDNS`), so
every lookup in the process answers to the attacker's script. A loopback server counts every
connection it accepts; the fence refuses and records every connection to any other address, so
the public address the attacker names is tried, seen, and never reached.
"""

from __future__ import annotations

import socket
from collections.abc import Collection
from typing import Any

import pytest

from chromium import needs_chromium
from keel.messages import ToolCall
from keel.tools.browser import browser_tools
from keel.tools.browser_proxy import GuardProxy
from keel.tools.executor import ExecutedCall, ToolExecutor
from keel.tools.web import web_tools
from netattack import LOOPBACK, PUBLIC, CountingServer, RebindingDNS, fence, proxy_exchange
from pageserver import PageServer

ATTACKS: dict[str, list[list[str]]] = {
    "public-then-loopback": [[PUBLIC], [LOOPBACK]],
    "public-twice-then-loopback": [[PUBLIC], [PUBLIC], [LOOPBACK]],
    "public-three-times-then-loopback": [[PUBLIC], [PUBLIC], [PUBLIC], [LOOPBACK]],
    "loopback-then-public": [[LOOPBACK], [PUBLIC]],
    "public-then-public-and-loopback": [[PUBLIC], [PUBLIC, LOOPBACK]],
    "public-then-loopback-and-public": [[PUBLIC], [LOOPBACK, PUBLIC]],
    "public-and-loopback-at-once": [[PUBLIC, LOOPBACK]],
    "loopback-and-public-at-once": [[LOOPBACK, PUBLIC]],
}


async def use(
    name: str, url: str, allow_hosts: Collection[str] = (), **options: Any
) -> ExecutedCall:
    executor = ToolExecutor(web_tools(allow_hosts=allow_hosts, **options))
    (executed,) = await executor.run_batch([ToolCall.from_arguments("w1", name, {"url": url})])
    return executed


def assert_connected_only_to_the_first_answer(
    attempts: list[tuple[str, int]], answers: list[list[str]], port: int
) -> None:
    """The address connected to for the target's `port` is one the first (the checked) answer
    gave, and only when that whole answer was public; never the loopback server."""
    attempts = [attempt for attempt in attempts if attempt[1] == port]
    assert (LOOPBACK, port) not in attempts
    if LOOPBACK in answers[0]:
        assert attempts == [], "a refused answer leads to no connection at all"
    else:
        assert attempts and {host for host, _ in attempts} <= set(answers[0])


@pytest.mark.parametrize("tool", ["fetch", "observe_page"])
@pytest.mark.parametrize("answers", list(ATTACKS.values()), ids=list(ATTACKS))
async def test_web_tools_connect_to_the_address_they_checked(
    tool: str, answers: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    dns = RebindingDNS({"rebind.test": answers})
    monkeypatch.setattr(socket, "getaddrinfo", dns)
    with CountingServer() as server, fence() as fenced:
        executed = await use(tool, f"http://rebind.test:{server.port}/admin")
    assert server.hits == 0, f"the loopback server was reached: {executed.result.content}"
    assert executed.result.is_error and "loopback secret" not in executed.result.content
    assert dns.lookups["rebind.test"] == 1, "one lookup per connection, no second one"
    assert_connected_only_to_the_first_answer(fenced.attempts, answers, server.port)


async def test_a_redirect_to_a_rebinding_name_is_pinned_too(
    page_server: PageServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    dns = RebindingDNS({"rebind.test": ATTACKS["public-then-loopback"]})
    monkeypatch.setattr(socket, "getaddrinfo", dns)
    with CountingServer() as server, fence():
        page_server.add_redirect("/go", f"http://rebind.test:{server.port}/admin")
        executed = await use("fetch", page_server.url("/go"), allow_hosts=["127.0.0.1"])
    assert server.hits == 0 and page_server.hits("/go") == 1
    assert executed.result.is_error and "loopback secret" not in executed.result.content
    assert dns.lookups["rebind.test"] == 1


@pytest.mark.parametrize("method", ["CONNECT", "GET"])
@pytest.mark.parametrize("answers", list(ATTACKS.values()), ids=list(ATTACKS))
async def test_the_guard_proxy_connects_to_the_address_it_checked(
    method: str, answers: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    dns = RebindingDNS({"rebind.test": answers})
    monkeypatch.setattr(socket, "getaddrinfo", dns)
    proxy = GuardProxy(allow_hosts=())
    proxy_url = await proxy.start()
    try:
        with CountingServer() as server, fence() as fenced:
            target = f"rebind.test:{server.port}"
            if method == "CONNECT":
                request = f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n"
            else:
                request = f"GET http://{target}/admin HTTP/1.1\r\nHost: {target}\r\n\r\n"
            reply = await proxy_exchange(proxy_url, request.encode())
    finally:
        await proxy.close()
    assert server.hits == 0, f"the loopback server was reached: {reply!r}"
    assert not reply.startswith(b"HTTP/1.1 200") and CountingServer.BODY not in reply
    assert dns.lookups["rebind.test"] == 1
    assert_connected_only_to_the_first_answer(fenced.attempts, answers, server.port)


@needs_chromium
async def test_the_browser_never_reaches_loopback_through_a_rebinding_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    names = {
        f"{attack}-{scheme}.test": (scheme, answers)
        for attack, answers in ATTACKS.items()
        for scheme in ("http", "https")
    }
    dns = RebindingDNS({name: answers for name, (_, answers) in names.items()})
    monkeypatch.setattr(socket, "getaddrinfo", dns)
    tools = browser_tools(timeout=20)
    observe = {t.name: t for t in tools}["browser_observe"]
    shown: list[str] = []
    try:
        with CountingServer() as server, fence() as fenced:
            for name, (scheme, _) in names.items():
                url = f"{scheme}://{name}:{server.port}/admin"
                try:
                    shown.append(await observe.invoke(observe.validate({"url": url})))
                except Exception as exc:  # refused or unreachable: what the model would read
                    shown.append(str(exc))
    finally:
        await tools.close()
    assert server.hits == 0, "the browser reached the loopback server"
    assert not any("loopback secret" in text for text in shown)
    assert (LOOPBACK, server.port) not in fenced.attempts
    assert {host for host, _ in fenced.outside()} <= {PUBLIC}
