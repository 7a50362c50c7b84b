"""The backends of `web_search`: a self-hosted SearXNG, Tavily's and Exa's APIs through their
SDKs, and the choice among them and the local index (`backend_from_spec`, what `--search`
names).

All three go through Keel's own HTTP client: `GuardedTransport` (`keel.tools.pinned`), so a
connection reaches only the address the host guard checked, under the same `allow_hosts` as
`fetch` (a SearXNG on loopback or the local network needs its host allowed), and
`CappedTransport`, which refuses compressed bodies and stops reading past a byte bound, so an
answer is bounded like a page. No redirect is followed: a search endpoint that redirects is
misconfigured, and following one would carry the Tavily key elsewhere.

Tavily's key comes from TAVILY_API_KEY and goes to ``api.tavily.com`` only, Exa's from
EXA_API_KEY to ``api.exa.ai`` only: each client's base URL is fixed, and `--search tavily` and
`--search exa` take no address (the rule of `keel.transports.keys`).
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import httpx

from keel.errors import ConfigError
from keel.tools.netguard import HostRefused, Resolver, vet_url
from keel.tools.pinned import GuardedTransport
from keel.tools.web_search import Hit, SearchBackend, SearchError

__all__ = [
    "BACKENDS",
    "MAX_ANSWER_BYTES",
    "TAVILY_HOST",
    "CappedTransport",
    "ExaBackend",
    "SearxngBackend",
    "TavilyBackend",
    "backend_from_spec",
    "hits_of",
]

BACKENDS = "searxng:URL, local:DIR, tavily or exa"
MAX_ANSWER_BYTES = 2_000_000
"""A search answer holds ten hits of a few hundred characters; 2 MB is room to spare."""
MAX_RESULTS = 50
TAVILY_HOST = "api.tavily.com"
TAVILY_KEY = "TAVILY_API_KEY"
EXA_HOST = "api.exa.ai"
EXA_KEY = "EXA_API_KEY"
_HEADERS = {"User-Agent": "keel/0.1 (research agent)", "Accept": "application/json"}


def capped_transport(
    inner: httpx.AsyncBaseTransport | None,
    allow_hosts: Collection[str],
    resolver: Resolver | None,
    max_bytes: int,
) -> httpx.AsyncBaseTransport:
    """`inner` (a test's) or a pinned, guarded transport, its answers bounded."""
    return CappedTransport(inner or GuardedTransport(allow_hosts, resolver), max_bytes)


class CappedTransport(httpx.AsyncBaseTransport):
    """Asks for an uncompressed body and reads at most `max_bytes` of it."""

    def __init__(self, inner: httpx.AsyncBaseTransport, max_bytes: int) -> None:
        self.inner = inner
        self.max_bytes = max_bytes

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        request.headers["Accept-Encoding"] = "identity"
        response = await self.inner.handle_async_request(request)
        try:
            encoding = response.headers.get("content-encoding", "identity").lower()
            if encoding not in ("", "identity"):
                raise SearchError(f"{request.url.host} sent a {encoding} body unasked")
            body = bytearray()
            async for chunk in _raw(response):
                body += chunk
                if len(body) > self.max_bytes:
                    raise SearchError(
                        f"{request.url.host} sent more than {self.max_bytes} bytes; a search "
                        "answer is never that large"
                    )
        finally:
            await response.aclose()
        headers = [(k, v) for k, v in response.headers.multi_items() if k != "content-length"]
        return httpx.Response(
            response.status_code, headers=headers, content=bytes(body), request=request
        )

    async def aclose(self) -> None:
        await self.inner.aclose()


async def _raw(response: httpx.Response) -> AsyncIterator[bytes]:
    """The body as it arrives, or as a transport that read it already holds it."""
    try:
        yield response.content
    except httpx.ResponseNotRead:
        async for chunk in response.aiter_raw():
            yield chunk


def hits_of(answer: Any, *, url: str, title: str, snippet: str) -> list[Hit]:
    """The hits of a decoded JSON answer whose ``results`` is a list of objects (the first
    `MAX_RESULTS`; the tool keeps the usable ones and cuts them to what the model asked)."""
    results = answer.get("results") if isinstance(answer, dict) else None
    if not isinstance(results, list):
        raise SearchError("the search engine's answer has no list of results")
    return [
        Hit(str(r.get(title) or ""), str(r.get(url) or ""), str(r.get(snippet) or ""))
        for r in results[:MAX_RESULTS]
        if isinstance(r, dict)
    ]


class SearxngBackend:
    """A SearXNG instance's JSON API: ``GET /search?q=...&format=json``."""

    name = "searxng"
    web = True

    def __init__(
        self,
        url: str,
        *,
        allow_hosts: Collection[str] = (),
        resolver: Resolver | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout: float = 20.0,
        max_bytes: int = MAX_ANSWER_BYTES,
    ) -> None:
        self.endpoint = _searxng_endpoint(url, allow_hosts)
        self.allow_hosts = tuple(allow_hosts)
        self.resolver = resolver
        self.transport = transport
        self.timeout = timeout
        self.max_bytes = max_bytes

    async def search(self, query: str, limit: int) -> list[Hit]:
        transport = capped_transport(
            self.transport, self.allow_hosts, self.resolver, self.max_bytes
        )
        params = {"q": query, "format": "json", "pageno": "1"}
        try:
            async with httpx.AsyncClient(
                transport=transport, timeout=self.timeout, trust_env=False, headers=_HEADERS
            ) as http:
                response = await http.get(self.endpoint, params=params)
        except HostRefused as exc:
            raise SearchError(exc.sentence(self.endpoint)) from None
        except httpx.TimeoutException:
            raise SearchError(f"SearXNG at {self.endpoint} did not answer in time") from None
        except httpx.HTTPError as exc:
            detail = str(exc) or type(exc).__name__
            raise SearchError(f"could not reach SearXNG at {self.endpoint}: {detail}") from None
        if response.status_code == 403:
            raise SearchError(
                f"SearXNG at {self.endpoint} refused format=json (403): its settings.yml must "
                "list json under search.formats"
            )
        if response.is_redirect or response.status_code >= 400:
            raise SearchError(f"SearXNG at {self.endpoint} answered HTTP {response.status_code}")
        try:
            answer = json.loads(response.content)
        except ValueError:
            raise SearchError(f"SearXNG at {self.endpoint} did not answer JSON") from None
        return hits_of(answer, url="url", title="title", snippet="content")  # cut once clean


def _searxng_endpoint(url: str, allow_hosts: Collection[str]) -> str:
    """The instance's search endpoint, or a ConfigError saying what to write."""
    try:
        parts = urlsplit(url.strip())
    except ValueError as exc:
        raise ConfigError(f"--search searxng:{url}: not a URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            f"--search searxng:{url}: give the instance's http(s) address, e.g. "
            "searxng:http://localhost:8888"
        )
    if parts.username or parts.password or parts.query or parts.fragment:
        raise ConfigError(
            f"--search searxng:{parts.scheme}://{parts.hostname}/...: no user, password, query "
            "or fragment in the address (Keel saves it with the run)"
        )
    refused = vet_url(url.strip(), allow_hosts)
    if refused is not None:
        raise ConfigError(f"--search: {refused}; add --allow-host {parts.netloc}")
    path = parts.path.rstrip("/")
    if not path.endswith("/search"):
        path += "/search"
    return f"{parts.scheme}://{parts.netloc}{path}"


class _KeyedApiBackend:
    """A search API reached through its official client, its key read from the environment and
    sent only to its own host, over Keel's guarded, bounded HTTP client (no redirects, no proxy
    settings from the environment). A subclass names the API and asks its client."""

    name = ""
    label = ""  # how messages name the API: "Tavily", "Exa"
    host = ""
    key_variable = ""
    client_module = ""  # the client's import name, looked for before any search
    web = True

    def __init__(
        self,
        *,
        env: Mapping[str, str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout: float = 20.0,
        max_bytes: int = MAX_ANSWER_BYTES,
    ) -> None:
        key = (os.environ if env is None else env).get(self.key_variable, "").strip()
        if not key:
            raise ConfigError(
                f"--search {self.name}: set {self.key_variable} to your {self.label} API key"
            )
        if importlib.util.find_spec(self.client_module) is None:
            raise ConfigError(
                f"--search {self.name} needs {self.label}'s client: "
                "pip install 'keel-runtime[search]'"
            )
        self._key = key
        self.transport = transport
        self.timeout = timeout
        self.max_bytes = max_bytes

    async def search(self, query: str, limit: int) -> list[Hit]:
        transport = capped_transport(self.transport, (), None, self.max_bytes)
        async with httpx.AsyncClient(
            base_url=f"https://{self.host}",
            transport=transport,
            timeout=self.timeout,
            trust_env=False,
            follow_redirects=False,
        ) as http:
            try:
                return (await self._ask(http, query, limit))[:limit]
            except SearchError:
                raise
            except HostRefused as exc:
                raise SearchError(exc.sentence(f"https://{self.host}/search")) from None
            except Exception as exc:  # the client's own errors, and httpx's under it
                detail = (str(exc) or type(exc).__name__).replace(self._key, "[key]")
                raise SearchError(f"{self.label}'s search failed: {detail[:500]}") from None

    async def _ask(self, http: httpx.AsyncClient, query: str, limit: int) -> list[Hit]:
        raise NotImplementedError


class TavilyBackend(_KeyedApiBackend):
    """Tavily's search API through its official client (`tavily-python`, extra `search`)."""

    name, label, host, key_variable, client_module = (
        "tavily", "Tavily", TAVILY_HOST, TAVILY_KEY, "tavily"
    )  # fmt: skip

    async def _ask(self, http: httpx.AsyncClient, query: str, limit: int) -> list[Hit]:
        from tavily import AsyncTavilyClient

        client = AsyncTavilyClient(api_key=self._key, client=http)
        answer = await client.search(
            query, search_depth="basic", max_results=limit, timeout=self.timeout
        )
        return hits_of(answer, url="url", title="title", snippet="content")


class ExaBackend(_KeyedApiBackend):
    """Exa's search API through its official client (`exa-py`, extra `search`), asked for
    highlights (the passages of each page that match the query) as the snippets."""

    name, label, host, key_variable, client_module = ("exa", "Exa", EXA_HOST, EXA_KEY, "exa_py")

    async def _ask(self, http: httpx.AsyncClient, query: str, limit: int) -> list[Hit]:
        answer = await _exa_on(http, self._key).search(
            query, num_results=limit, contents={"highlights": True}, timeout=self.timeout
        )
        return [_exa_hit(result) for result in list(answer.results or ())[:MAX_RESULTS]]


def _exa_on(http: httpx.AsyncClient, key: str) -> Any:
    """Exa's async client sending through `http` (Keel's guarded, bounded client): the client
    reads its HTTP client from its `client` property, which this subclass answers."""
    from exa_py import AsyncExa

    class OnKeelsClient(AsyncExa):
        @property
        def client(self) -> httpx.AsyncClient:
            return http

    return OnKeelsClient(api_key=key, api_base=f"https://{EXA_HOST}")


def _exa_hit(result: Any) -> Hit:
    highlights = getattr(result, "highlights", None) or ()
    snippet = " ... ".join(str(h) for h in highlights) or str(getattr(result, "text", "") or "")
    return Hit(str(getattr(result, "title", "") or ""), str(getattr(result, "url", "")), snippet)


def backend_from_spec(
    spec: str, *, allow_hosts: Sequence[str] = (), repo: str | None = None
) -> SearchBackend:
    """The backend `--search` names; a ConfigError that says what to write otherwise.
    `allow_hosts` are the run's (a SearXNG on a private host needs its name there); `repo`
    is the folder the file tools read, so a local index inside it gives paths they take."""
    kind, _, rest = spec.strip().partition(":")
    kind = kind.lower()
    if kind == "searxng":
        return SearxngBackend(rest, allow_hosts=allow_hosts)
    if kind == "local":
        from keel.tools.local_index import LocalIndexBackend

        if not rest:
            raise ConfigError("--search local:DIR needs the folder (indexed by keel index DIR)")
        return LocalIndexBackend(rest, repo=repo)
    if kind == "tavily":
        if rest:
            raise ConfigError(
                "--search tavily takes no address: Keel sends TAVILY_API_KEY to Tavily's own "
                "host only"
            )
        return TavilyBackend()
    if kind == "exa":
        if rest:
            raise ConfigError(
                "--search exa takes no address: Keel sends EXA_API_KEY to Exa's own host only"
            )
        return ExaBackend()
    raise ConfigError(f"--search {spec!r}: the backends are {BACKENDS}")
