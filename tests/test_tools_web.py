"""Web tools against a real loopback server: text out, local hosts refused, every hop checked."""

from __future__ import annotations

import socket
from collections.abc import Collection
from typing import Any

import httpx
import pytest

from keel.messages import ToolCall
from keel.tools.base import Effect
from keel.tools.browser_proxy import GuardProxy
from keel.tools.executor import ExecutedCall, ToolExecutor
from keel.tools.netguard import check_url
from keel.tools.web import web_tools
from netattack import CountingServer, fence, proxy_exchange
from pageserver import PageServer

ARTICLE = """<!doctype html>
<html><head><title>Keel &amp; friends</title><style>body { color: red; }</style>
<script>var secret = 1;</script></head>
<body><h1>Release notes</h1>
<p>Version <b>2.0</b> adds <a href="/changes">the change list</a>.</p>
<img src="/logo.png" alt="logo"></body></html>"""


async def use(
    name: str, url: str, allow_hosts: Collection[str] = ("127.0.0.1",), **options: Any
) -> ExecutedCall:
    executor = ToolExecutor(web_tools(allow_hosts=allow_hosts, **options))
    (executed,) = await executor.run_batch([ToolCall.from_arguments("w1", name, {"url": url})])
    return executed


def test_fetch_is_read_only_and_observe_page_is_an_observation() -> None:
    fetch, observe = web_tools()
    assert (fetch.name, fetch.effect) == ("fetch", Effect.READ_ONLY)
    assert (observe.name, observe.effect) == ("observe_page", Effect.OBSERVATION)
    assert "\n" not in fetch.description and "redirects" in fetch.description
    assert fetch.parameters["required"] == ["url"]


async def test_html_becomes_readable_text_with_links(page_server: PageServer) -> None:
    page_server.add_page("/notes", ARTICLE)
    executed = await use("fetch", page_server.url("/notes"))
    text = executed.result.content
    assert not executed.result.is_error, text
    assert text.startswith(f"URL: {page_server.url('/notes')}\nStatus: 200\n")
    assert "Title: Keel & friends" in text
    assert "# Release notes" in text and "**2.0**" in text
    assert f"[the change list]({page_server.url('/changes')})" in text
    for markup in ("<p>", "<b>", "<a ", "<h1>", "color: red", "secret", "logo.png"):
        assert markup not in text


async def test_observe_page_sees_each_new_state(page_server: PageServer) -> None:
    page_server.add_dynamic("/job", lambda n: "done" if n >= 2 else "running", "text/plain")
    first = await use("observe_page", page_server.url("/job"))
    second = await use("observe_page", page_server.url("/job"))
    assert first.result.content.rstrip().endswith("running")
    assert second.result.content.rstrip().endswith("done")
    assert page_server.hits("/job") == 2


async def test_json_and_plain_text_are_returned_as_text(page_server: PageServer) -> None:
    page_server.add_page("/api", '{"ok": true, "items": [1, 2]}', "application/json")
    page_server.add_page("/readme", "line one\nline two", "text/plain; charset=utf-8")
    api = await use("fetch", page_server.url("/api"))
    readme = await use("fetch", page_server.url("/readme"))
    assert '{"ok": true, "items": [1, 2]}' in api.result.content
    assert "Content-Type: application/json" in api.result.content
    assert "line one\nline two" in readme.result.content


async def test_loopback_is_refused_without_allow_hosts(page_server: PageServer) -> None:
    page_server.add_page("/secret", "admin panel")
    executed = await use("fetch", page_server.url("/secret"), allow_hosts=())
    assert executed.result.is_error
    assert "loopback" in executed.result.content and "allow_hosts" in executed.result.content
    assert "admin panel" not in executed.result.content
    assert page_server.hits("/secret") == 0


async def test_allow_hosts_accepts_the_host_or_the_host_and_its_port(
    page_server: PageServer,
) -> None:
    page_server.add_page("/doc", "<p>hello</p>")
    url = page_server.url("/doc")
    by_host = await use("fetch", url, allow_hosts=["127.0.0.1"])
    by_port = await use("fetch", url, allow_hosts=[f"127.0.0.1:{page_server.port}"])
    other_port = await use("fetch", url, allow_hosts=["127.0.0.1:1"])
    assert "hello" in by_host.result.content and not by_host.result.is_error
    assert "hello" in by_port.result.content and not by_port.result.is_error
    assert other_port.result.is_error and "loopback" in other_port.result.content
    assert page_server.hits("/doc") == 2


async def test_a_redirect_into_a_refused_host_is_refused(page_server: PageServer) -> None:
    with PageServer() as internal:
        internal.add_page("/admin", "internal secrets")
        page_server.add_redirect("/innocent", internal.url("/admin"))
        allowed = [f"127.0.0.1:{page_server.port}"]
        executed = await use("fetch", page_server.url("/innocent"), allow_hosts=allowed)
        assert executed.result.is_error
        assert "redirect" in executed.result.content and "loopback" in executed.result.content
        assert "internal secrets" not in executed.result.content
        assert page_server.hits("/innocent") == 1 and internal.hits("/admin") == 0


async def test_allowed_redirects_are_followed_and_reported(page_server: PageServer) -> None:
    page_server.add_redirect("/old", "/new", status=301)
    page_server.add_page("/new", "<p>moved here</p>")
    executed = await use("fetch", page_server.url("/old"))
    assert f"URL: {page_server.url('/new')}" in executed.result.content
    assert f"Redirected from: {page_server.url('/old')}" in executed.result.content
    assert "moved here" in executed.result.content


async def test_redirect_loops_stop_with_an_error(page_server: PageServer) -> None:
    page_server.add_redirect("/a", "/b")
    page_server.add_redirect("/b", "/a")
    executed = await use("fetch", page_server.url("/a"))
    assert executed.result.is_error and "too many redirects" in executed.result.content
    assert page_server.hits("/a") + page_server.hits("/b") == 6


async def test_downloads_stop_at_the_size_cap_and_say_so(page_server: PageServer) -> None:
    page_server.add_page("/big", "a" * 5000 + "TAIL", "text/plain")
    executed = await use("fetch", page_server.url("/big"), max_download_bytes=1000)
    text = executed.result.content
    assert not executed.result.is_error
    assert "download stopped at 1000 bytes" in text
    assert "a" * 1000 in text and "a" * 1001 not in text and "TAIL" not in text


async def test_http_errors_become_error_results_with_status(page_server: PageServer) -> None:
    page_server.add_page("/gone", "<p>nothing</p>", status=410)
    missing = await use("fetch", page_server.url("/missing"))
    gone = await use("fetch", page_server.url("/gone"))
    assert missing.result.is_error and "404 Not Found" in missing.result.content
    assert gone.result.is_error and "410 Gone" in gone.result.content


async def test_non_text_content_is_an_error(page_server: PageServer) -> None:
    page_server.add_page("/logo.png", b"\x89PNG\r\n\x1a\n\x00\x00", "image/png")
    executed = await use("fetch", page_server.url("/logo.png"))
    assert executed.result.is_error and "image/png" in executed.result.content
    assert "not a text page" in executed.result.content


async def test_a_slow_page_times_out_into_an_error(page_server: PageServer) -> None:
    page_server.add_slow("/slow", 2.0, "late")
    executed = await use("fetch", page_server.url("/slow"), timeout=0.2)
    assert executed.result.is_error and "late" not in executed.result.content


async def test_an_injected_client_is_used(page_server: PageServer) -> None:
    seen: list[str] = []

    async def record(request: httpx.Request) -> None:
        seen.append(str(request.url))

    page_server.add_page("/x", "<p>x</p>")
    async with httpx.AsyncClient(event_hooks={"request": [record]}) as client:
        executed = await use("fetch", page_server.url("/x"), client=client)
    assert not executed.result.is_error and seen == [page_server.url("/x")]


# -- the guard on its own -----------------------------------------------------------------

LOOPBACK_SPELLINGS = [
    "http://127.0.0.1:{port}/",
    "http://127.1:{port}/",
    "http://127.0.1:{port}/",
    "http://2130706433:{port}/",
    "http://0x7f000001:{port}/",
    "http://0x7f.1:{port}/",
    "http://017700000001:{port}/",
    "http://0177.0.0.1:{port}/",
    "http://127\u30020\u30020\u30021:{port}/",
    "http://localhost:{port}/",
    "http://LocalHost:{port}/",
    "http://user@127.0.0.1:{port}/",
    "http://public.example@127.0.0.1:{port}/",
    "http://127.0.0.1:{port}#@public.example/",
    "http://[::1]:{port}/",
    "http://[0:0:0:0:0:0:0:1]:{port}/",
    "http://[::1%25lo]:{port}/",
    "http://[::ffff:127.0.0.1]:{port}/",
    "http://[::ffff:7f00:1]:{port}/",
    "http://[::FFFF:127.0.0.1]:{port}/",
    "http://[0:0:0:0:0:ffff:127.0.0.1]:{port}/",
    "http://[0000:0000:0000:0000:0000:ffff:7f00:0001]:{port}/",
    "http://[64:ff9b::7f00:1]:{port}/",
    "http://[64:ff9b::127.0.0.1]:{port}/",
    "http://[0064:ff9b:0000:0000:0000:0000:7f00:0001]:{port}/",
    "http://[2002:7f00:1::]:{port}/",
]
"""127.0.0.1 in every spelling a URL parser or the system resolver accepts: IPv4 shorthand,
decimal, hex and octal, ideographic full stops, names, userinfo and fragment tricks, and the
IPv6 forms that stand for it (loopback, IPv4-mapped, NAT64, 6to4)."""


@pytest.mark.parametrize(
    ("url", "word"),
    [
        ("http://127.0.0.1/", "loopback"),
        ("http://[::1]:8080/", "loopback"),
        ("http://[::ffff:127.0.0.1]/", "loopback"),
        ("http://10.1.2.3/", "private"),
        ("http://169.254.169.254/latest/meta-data", "link-local"),
        ("http://0.0.0.0/", "unspecified"),
        ("http://224.0.0.1/", "multicast"),
        ("ftp://93.184.216.34/file", "only http and https"),
        ("file:///etc/passwd", "only http and https"),
        ("http:///nohost", "no host"),
        *[(url, "loopback") for url in LOOPBACK_SPELLINGS],
        # IPv4-mapped IPv6, every spelling: the kernel connects to the IPv4 address inside.
        ("http://[::ffff:169.254.169.254]/", "link-local (IPv4-mapped form of 169.254.169.254)"),
        ("http://[::ffff:a9fe:a9fe]/", "link-local (IPv4-mapped form of 169.254.169.254)"),
        ("http://[::ffff:10.0.0.1]/", "private (IPv4-mapped form of 10.0.0.1)"),
        # NAT64 (64:ff9b::/96): a NAT64 gateway connects to the IPv4 address inside.
        ("http://[64:ff9b::a9fe:a9fe]/", "link-local (NAT64 form of 169.254.169.254)"),
        ("http://[64:ff9b::10.0.0.1]/", "private (NAT64 form of 10.0.0.1)"),
        ("http://[64:ff9b:1::7f00:1]/", "private (local-use NAT64)"),
        # 6to4 (2002::/16) carries an IPv4 address too.
        ("http://[2002:a9fe:a9fe::1]/", "link-local (6to4 form of 169.254.169.254)"),
        # Scoped (zone id) forms, percent-encoded or not, by name or by number.
        ("http://[fe80::1%25eth0]/", "link-local"),
        ("http://[fe80::1%eth0]/", "link-local"),
        ("http://[fe80::1%251]:8080/", "link-local"),
        ("http://[FE80::A9FE:A9FE%25ETH0]/", "link-local"),
        # Other non-public ranges and cloud metadata services.
        ("http://[::7f00:1]/", "reserved"),
        ("http://[fd00:ec2::254]/latest/meta-data", "private"),
        ("http://[fc00::1]/", "private"),
        ("http://[2001:0:4136:e378:8000:63bf:80ff:fffe]/", "private"),
        ("http://[ff02::1]/", "multicast"),
        ("http://[::]/", "unspecified"),
        ("http://0/", "unspecified"),
        ("http://100.64.0.1/", "non-public"),
        ("http://100.100.100.200/latest/meta-data", "non-public"),
        ("http://168.63.129.16/metadata", "cloud metadata"),
        ("http://192.0.0.192/opc/v2/instance", "cloud metadata"),
        ("http://192.0.0.170/", "private"),
        ("http://192.0.0.100/", "reserved (IETF protocol assignments)"),
        ("http://198.18.0.1/", "private"),
        ("http://240.0.0.1/", "private"),
    ],
)
async def test_check_url_refuses_non_public_targets(url: str, word: str) -> None:
    refusal = await check_url(url.format(port=8080), allow_hosts=())
    assert refusal is not None and word in refusal


@pytest.mark.parametrize(
    "url",
    [
        "http://[64:ff9b::5db8:d822]/",
        "http://[2002:5db8:d822::1]/",
        "http://[::ffff:93.184.216.34]/",
    ],
)
async def test_check_url_judges_an_embedded_public_ipv4_as_public(url: str) -> None:
    """NAT64 and 6to4 forms of a public address are how IPv6-only networks reach it."""
    assert await check_url(url, allow_hosts=()) is None


@pytest.mark.parametrize("spelling", LOOPBACK_SPELLINGS)
@pytest.mark.parametrize("via", ["fetch", "proxy"])
async def test_no_spelling_of_loopback_reaches_a_loopback_server(spelling: str, via: str) -> None:
    """The URL-form table as the attack: each spelling, aimed at a live loopback server, through
    `fetch` and through the browser's guard proxy; nothing connects anywhere."""
    with CountingServer() as server, fence() as fenced:
        url = spelling.format(port=server.port)
        if via == "fetch":
            executed = await use("fetch", url, allow_hosts=())
            assert executed.result.is_error and "loopback secret" not in executed.result.content
            assert executed.result.content.startswith("refused to fetch")
        else:
            proxy = GuardProxy(allow_hosts=())
            proxy_url = await proxy.start()
            try:
                reply = await proxy_exchange(proxy_url, f"GET {url} HTTP/1.1\r\n\r\n".encode())
            finally:
                await proxy.close()
            assert reply.startswith(b"HTTP/1.1 403") and b"refused to fetch" in reply
    assert server.hits == 0
    assert [attempt for attempt in fenced.attempts if attempt[1] == server.port] == []


async def test_check_url_allows_public_addresses() -> None:
    assert await check_url("https://93.184.216.34/page", allow_hosts=()) is None


async def test_check_url_allow_hosts_is_case_insensitive_and_bracket_tolerant() -> None:
    assert await check_url("http://LocalHost:8000/", ["localhost"]) is None
    assert await check_url("http://[::1]:8000/", ["[::1]:8000"]) is None
    assert await check_url("http://[::1]:8000/", ["::1"]) is None
    assert await check_url("http://[::1]:8001/", ["[::1]:8000"]) is not None


async def test_check_url_refuses_a_name_resolving_to_any_private_address(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def fake_getaddrinfo(host: str, *args: Any, **kwargs: Any) -> list[Any]:
        stream = socket.SOCK_STREAM
        return [
            (socket.AF_INET, stream, 6, "", ("93.184.216.34", 0)),
            (socket.AF_INET, stream, 6, "", ("192.168.1.5", 0)),
        ]

    monkeypatch.setattr(socket, "getaddrinfo", fake_getaddrinfo)
    refusal = await check_url("https://public.example/", allow_hosts=())
    assert refusal is not None and "192.168.1.5" in refusal and "private" in refusal


async def test_check_url_refuses_an_unresolvable_host(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(host: str, *args: Any, **kwargs: Any) -> list[Any]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", fail)
    refusal = await check_url("https://no-such-host.invalid/", allow_hosts=())
    assert refusal is not None and "was not found: its DNS lookup failed" in refusal
