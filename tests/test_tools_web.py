"""Web tools against a real loopback server: text out, local hosts refused, every hop checked."""

from __future__ import annotations

import socket
from collections.abc import Collection
from typing import Any

import httpx
import pytest

from keel.messages import ToolCall
from keel.tools.base import Effect
from keel.tools.executor import ExecutedCall, ToolExecutor
from keel.tools.netguard import check_url
from keel.tools.web import web_tools
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
    ],
)
async def test_check_url_refuses_non_public_targets(url: str, word: str) -> None:
    refusal = await check_url(url, allow_hosts=())
    assert refusal is not None and word in refusal


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
    assert refusal is not None and "could not be resolved" in refusal
