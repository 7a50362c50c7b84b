"""Web tools: fetch a page as readable text, or observe a page that changes.

Both tools share one fetching path. Redirects are followed by hand so that the host guard
(`keel.tools.netguard`) sees every hop: a public page must not be able to redirect the agent
into loopback or the local network. Keel's own client connects through `GuardedTransport`
(`keel.tools.pinned`), which resolves each connection's host once, checks every address and
connects to the checked one, so DNS rebinding cannot move a hop between check and connection.
Bodies are streamed and cut at a byte limit, HTML is turned into text with links kept, and
anything that is not text is refused rather than dumped on the model. Failures raise; the
executor turns them into error results the model reads.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin

from keel.errors import ToolError
from keel.tools.base import Effect, Tool, make_tool
from keel.tools.netguard import HostRefused, Resolver, check_url, refusal, vet_url

if TYPE_CHECKING:  # httpx, html2text and the pinned transport: imported by the first fetch
    import httpx

__all__ = ["MAX_REDIRECTS", "FetchError", "web_tools"]

MAX_REDIRECTS = 5
_REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
_HEADERS = {
    "User-Agent": "keel/0.1 (research agent)",
    "Accept": "text/html,application/xhtml+xml,text/plain,application/json;q=0.9,*/*;q=0.5",
}
_TITLE = re.compile(r"<title[^>]*>(.*?)</title\s*>", re.IGNORECASE | re.DOTALL)


class FetchError(ToolError):
    """A page could not be fetched or read; the message is for the model."""


@dataclass(frozen=True, slots=True)
class _Page:
    url: str
    status: int
    content_type: str
    body: bytes
    charset: str | None
    cut: bool
    redirected_from: str | None


def web_tools(
    *,
    allow_hosts: Collection[str] = (),
    client: httpx.AsyncClient | None = None,
    max_download_bytes: int = 5_000_000,
    timeout: float = 20.0,
    resolver: Resolver | None = None,
) -> list[Tool]:
    """The `fetch` (read_only) and `observe_page` (observation) tools.

    `allow_hosts` lists hosts (``name`` or ``name:port``) the guard lets through even though
    they resolve to loopback or private addresses. Without `client`, each call opens its own
    client on `GuardedTransport`: no proxy, no environment settings, every connection made to
    the address the guard checked, looked up once through `resolver` (the system's by
    default). A `client` you pass (to use a proxy, say) makes its own connections: the guard
    then checks each hop's host before the request, and stopping DNS rebinding is up to that
    client (build it on `GuardedTransport` for the same protection).
    """
    allowed = tuple(allow_hosts)

    async def read_page(url: str) -> str:
        import httpx

        from keel.tools.pinned import GuardedTransport

        if client is not None:
            page = await _download(client, url, allowed, max_download_bytes, pinned=False)
        else:
            transport = GuardedTransport(allowed, resolver)
            async with httpx.AsyncClient(
                transport=transport, timeout=timeout, trust_env=False, headers=_HEADERS
            ) as http:
                page = await _download(http, url, allowed, max_download_bytes, pinned=True)
        return _render(page, max_download_bytes)

    async def fetch(url: str) -> str:
        """Download a web page (http or https) and return it as readable text.
        HTML is converted to Markdown-like text with links kept as [text](url); plain text, JSON
        and XML are returned as they are. The first lines give the final URL (after redirects),
        the HTTP status and the content type. Use it to read documentation, articles and API
        responses. It cannot run JavaScript, log in, or read PDFs, images or other binary
        files, and hosts on the local network are refused.
        """
        return await read_page(url)

    async def observe_page(url: str) -> str:
        """Look at the current state of a web page that may change between calls.
        Use it for a status page, a job or build result, or a list being updated; it returns
        the page's text in the same format as fetch. Call it again later to see whether the
        page has changed: a changed page counts as progress, an unchanged one does not.
        """
        return await read_page(url)

    return [
        make_tool(fetch, description=_one_line(fetch), effect=Effect.READ_ONLY, timeout=timeout),
        make_tool(
            observe_page,
            description=_one_line(observe_page),
            effect=Effect.OBSERVATION,
            timeout=timeout,
        ),
    ]


def _one_line(fn: Callable[..., Any]) -> str:
    """The model reads the whole docstring as one paragraph."""
    return " ".join((inspect.getdoc(fn) or "").split())


async def _download(
    client: httpx.AsyncClient,
    url: str,
    allow_hosts: Collection[str],
    max_bytes: int,
    *,
    pinned: bool,
) -> _Page:
    """GET `url`, following up to MAX_REDIRECTS redirects, each hop checked by the guard: at
    the connection when the client is `pinned`, else by a lookup of its own before it."""
    import httpx

    current = url
    for _hop in range(MAX_REDIRECTS + 1):
        if pinned:
            refused = vet_url(current, allow_hosts)
        else:
            refused = await check_url(current, allow_hosts)
        if refused is not None:
            raise FetchError(_hop_refusal(refused, current, url))
        try:
            async with client.stream(
                "GET", current, headers=_HEADERS, follow_redirects=False
            ) as response:
                location = response.headers.get("location")
                if response.status_code in _REDIRECT_STATUSES and location:
                    current = urljoin(str(response.url), location)
                    continue
                if response.status_code >= 400:
                    raise FetchError(
                        f"HTTP {response.status_code} {response.reason_phrase} for {current}"
                    )
                body, cut = await _read_capped(response, max_bytes)
                return _Page(
                    url=str(response.url),
                    status=response.status_code,
                    content_type=response.headers.get("content-type", ""),
                    body=body,
                    charset=response.charset_encoding,
                    cut=cut,
                    redirected_from=url if current != url else None,
                )
        except HostRefused as exc:
            raise FetchError(_hop_refusal(exc.sentence(current), current, url)) from None
        except httpx.InvalidURL as exc:
            invalid = refusal(current, f"not a valid URL ({exc})")
            raise FetchError(_hop_refusal(invalid, current, url)) from None
        except httpx.TimeoutException:
            raise FetchError(f"timed out fetching {current}") from None
        except httpx.HTTPError as exc:
            detail = str(exc) or type(exc).__name__
            raise FetchError(f"could not fetch {current}: {detail}") from None
    raise FetchError(f"too many redirects (more than {MAX_REDIRECTS}) starting from {url}")


def _hop_refusal(message: str, current: str, url: str) -> str:
    return message if current == url else f"{message} (reached by a redirect from {url})"


async def _read_capped(response: httpx.Response, max_bytes: int) -> tuple[bytes, bool]:
    """Read at most `max_bytes` of the (decoded) body; say whether it was cut."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        if size + len(chunk) > max_bytes:
            chunks.append(chunk[: max_bytes - size])
            return b"".join(chunks), True
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks), False


def _render(page: _Page, max_bytes: int) -> str:
    mime = page.content_type.split(";", 1)[0].strip().lower()
    text = page.body.decode(_codec(page.charset), errors="replace")
    kind = _kind(mime, text)
    if kind is None:
        raise FetchError(
            f"{page.url} is {mime or 'of unknown type'}, not a text page; "
            "only HTML, text, JSON and XML can be read"
        )
    header = [f"URL: {page.url}", f"Status: {page.status}", f"Content-Type: {mime or 'unknown'}"]
    if page.redirected_from:
        header.append(f"Redirected from: {page.redirected_from}")
    if page.cut:
        header.append(f"Note: download stopped at {max_bytes} bytes; the rest is not shown")
    if kind == "html":
        title = _TITLE.search(text)
        if title:
            import html  # pages only: the module is not needed to start (ADR 0042)

            header.append(f"Title: {' '.join(html.unescape(title.group(1)).split())}")
        text = _html_to_text(text, page.url)
    return "\n".join(header) + "\n\n" + text.strip() + "\n"


def _codec(charset: str | None) -> str:
    if charset:
        try:
            "".encode(charset)
            return charset
        except LookupError:
            pass
    return "utf-8"


def _kind(mime: str, text: str) -> str | None:
    if mime in ("text/html", "application/xhtml+xml"):
        return "html"
    if mime.startswith("text/") or mime.endswith(("/json", "+json", "/xml", "+xml")):
        return "text"
    if not mime and "\x00" not in text:
        return "html" if re.match(r"\s*(<!doctype html|<html)", text, re.IGNORECASE) else "text"
    return None


def _html_to_text(markup: str, base_url: str) -> str:
    import html2text

    converter = html2text.HTML2Text(baseurl=base_url, bodywidth=0)
    converter.ignore_links = False
    converter.ignore_images = True
    converter.body_width = 0
    return converter.handle(markup)
