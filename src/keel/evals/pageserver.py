"""A loopback HTTP server with scripted pages, for evaluations and tests.

Evaluations ship with the product (``keel eval``), and they run real web tools against real
HTTP, so the pages they need live here rather than in the test suite. Standard library only. It
binds 127.0.0.1 on a free port and serves from a daemon thread:

    with PageServer() as server:
        server.add_page("/doc", "<h1>Hello</h1>")
        server.add_progress("/build", steps=4)
        fetch(server.url("/doc"))
        assert server.hits("/doc") == 1

Each kind of page exists because a runtime rule depends on it: a page that changes on every
request (the evidence-reset cap), a progress page and a page that settles (polling is not a
loop), large documents (context elision), slow and failing pages (timeouts and error results),
pages that change only through JavaScript (what a browser sees but an HTTP fetch does not), and
a SearXNG-shaped search endpoint (`web_search`'s backend, answering its JSON over given pages).
Everything is deterministic: no clocks or random text, so an unchanged page has a stable digest.

Routes match on the URL path (the query string is ignored, but by the SearXNG-shaped search
page, which reads ``q`` and ``format``); an unknown path answers 404.
Templates use ``{n}`` for the 1-based request count of the path, replaced literally, so HTML and
JavaScript braces need no escaping.
"""

from __future__ import annotations

import html
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, urlparse, urlsplit

__all__ = [
    "HTML",
    "PageServer",
    "fill",
    "large_document",
    "progress_text",
    "script_page",
    "searxng_answer",
]

HTML = "text/html; charset=utf-8"

Response = tuple[int, dict[str, str], bytes]


@dataclass(frozen=True)
class _Route:
    respond: Callable[[int, str], Response]
    """Given the 1-based hit count for the path and the query string: status, headers, body."""


def _encode(body: str | bytes) -> bytes:
    return body.encode("utf-8") if isinstance(body, str) else body


def fill(template: str, n: int) -> str:
    """``{n}`` in a template is the request count; nothing else is interpreted."""
    return template.replace("{n}", str(n))


def searxng_answer(query: str, results: list[dict[str, str]]) -> dict[str, object]:
    """What a SearXNG instance answers to ``/search?q=QUERY&format=json`` (the fields of its
    `get_json_response`): the results whose title or content holds a word of the query, in
    the order given."""
    words = {w.lower() for w in query.split() if len(w) > 2}
    found = [
        r for r in results
        if words & set(f"{r.get('title', '')} {r.get('content', '')}".lower().split())
    ]  # fmt: skip
    return {
        "query": query,
        "number_of_results": len(found),
        "results": [_searxng_result(n, r) for n, r in enumerate(found, 1)],
        "answers": [],
        "corrections": [],
        "infoboxes": [],
        "suggestions": [],
        "unresponsive_engines": [],
    }


def _searxng_result(n: int, result: dict[str, str]) -> dict[str, object]:
    """One result with the fields SearXNG's `MainResult` gives it."""
    return {
        "url": result["url"],
        "title": result.get("title", ""),
        "content": result.get("content", ""),
        "engine": "wikipedia",
        "engines": ["wikipedia"],
        "positions": [n],
        "score": round(1.0 / n, 3),
        "category": "general",
        "template": "default.html",
        "parsed_url": list(urlparse(result["url"])),
        "publishedDate": None,
    }


def progress_text(n: int, steps: int, done: str = "finished") -> str:
    """The n-th poll of a job that takes `steps` polls: 100% and `done` from poll `steps` on."""
    if n >= steps:
        return f"<h1>Job status</h1><p>Progress: 100%. The job has {html.escape(done)}.</p>"
    percent = n * 100 // steps
    return (
        f"<h1>Job status</h1><p>Progress: {percent}% (stage {n} of {steps}). "
        "The job is still running.</p>"
    )


def large_document(size_bytes: int, topic: str, title: str = "Design document") -> str:
    """An HTML document of about `size_bytes`: numbered sections that repeat `topic`.

    Sections are numbered so the text is not one repeated line (a reader can tell parts apart),
    yet the whole is a pure function of its arguments.
    """
    head = f"<html><head><title>{html.escape(title)}</title></head><body>"
    parts = [head, f"<h1>{html.escape(title)}</h1>"]
    size = len(head)
    section = 0
    sentence = html.escape(topic)
    while size < size_bytes:
        section += 1
        block = (
            f"<h2>Section {section}</h2><p>{sentence} This is paragraph {section} of the "
            f"{html.escape(title.lower())}; it restates the point with its own number. "
            f"{sentence}</p>"
        )
        parts.append(block)
        size += len(block)
    parts.append("</body></html>")
    return "".join(parts)


def script_page(title: str, interval_ms: int, ticks: int | None, text: str) -> str:
    """A page whose visible text is written only by JavaScript.

    The HTML sent over HTTP never changes and holds none of the text: an HTTP fetch sees an
    empty status, a browser sees ``text`` followed by the tick count, which grows every
    `interval_ms` until `ticks` (forever when None). With ``interval_ms`` 0 the script writes
    the text once, so the page renders through JavaScript but does not change.
    """
    limit = "null" if ticks is None else str(ticks)
    js = (
        "(function(){var el=document.getElementById('status');"
        f"var label={json.dumps(text)};var n=0;var limit={limit};"
        "function show(){el.textContent=label+' '+n;}"
        "show();"
        f"if({interval_ms}>0){{var t=setInterval(function(){{n+=1;show();"
        f"if(limit!==null&&n>=limit){{clearInterval(t);}}}},{interval_ms});}}"
        "})();"
    )
    return (
        f"<html><head><title>{html.escape(title)}</title></head><body>"
        f'<h1>{html.escape(title)}</h1><p id="status"></p>'
        f"<script>{js}</script></body></html>"
    )


class PageServer:
    """Scripted pages on 127.0.0.1; use as a context manager or call start() and stop()."""

    def __init__(self) -> None:
        self._routes: dict[str, _Route] = {}
        self._hits: dict[str, int] = {}
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- routes ---------------------------------------------------------------------------

    def add_page(
        self, path: str, body: str | bytes, content_type: str = HTML, status: int = 200
    ) -> None:
        data = _encode(body)
        self._add(path, lambda _n: (status, {"Content-Type": content_type}, data))

    def add_dynamic(self, path: str, fn: Callable[[int], str], content_type: str = HTML) -> None:
        """A page whose body is fn(n) on the n-th request: pages that change or settle."""
        self._add(path, lambda n: (200, {"Content-Type": content_type}, _encode(fn(n))))

    def add_changing(self, path: str, template: str = "<p>version {n}</p>") -> None:
        """A page that differs on every request: it never stops changing."""
        self.add_dynamic(path, lambda n: fill(template, n))

    def add_progress(self, path: str, steps: int = 4, done: str = "finished") -> None:
        """A job status page that advances on each poll and reads 100% from poll `steps` on."""
        if steps < 1:
            raise ValueError("a progress page needs at least 1 step")
        self.add_dynamic(path, lambda n: progress_text(n, steps, done))

    def add_settling(
        self, path: str, settle_after: int, template: str = "<p>status: pending, check {n}</p>"
    ) -> None:
        """A page that changes on each of its first `settle_after` requests, then stays put."""
        if settle_after < 1:
            raise ValueError("settle_after must be at least 1")
        self.add_dynamic(path, lambda n: fill(template, min(n, settle_after)))

    def add_large(
        self, path: str, size_bytes: int, topic: str, title: str = "Design document"
    ) -> None:
        """A large document (hundreds of KB), built once: the incident's repeated reads."""
        self.add_page(path, large_document(size_bytes, topic, title))

    def add_error(self, path: str, status: int = 500, body: str = "internal server error") -> None:
        self.add_page(path, body, "text/plain; charset=utf-8", status)

    def add_script_page(
        self,
        path: str,
        *,
        interval_ms: int = 100,
        ticks: int | None = None,
        text: str = "ticks:",
        title: str = "Live status",
    ) -> None:
        """A page whose text changes only through JavaScript; see `script_page`."""
        self.add_page(path, script_page(title, interval_ms, ticks, text))

    def add_redirect(self, path: str, location: str, status: int = 302) -> None:
        self._add(path, lambda _n: (status, {"Location": location}, b""))

    def add_slow(
        self, path: str, seconds: float, body: str | bytes = "slow", content_type: str = HTML
    ) -> None:
        """A page that answers after `seconds` (blocking only its own server thread)."""
        data = _encode(body)

        def respond(_n: int) -> Response:
            time.sleep(seconds)
            return 200, {"Content-Type": content_type}, data

        self._add(path, respond)

    def add_searxng(self, path: str, results: list[dict[str, str]]) -> None:
        """A SearXNG instance's search endpoint over `results` (`searxng_answer`): JSON for
        ``format=json``, else 403, as an instance that has not enabled JSON answers."""

        def respond(_n: int, query: str) -> Response:
            asked = parse_qs(query)
            if asked.get("format") != ["json"]:
                return 403, {"Content-Type": "text/html; charset=utf-8"}, b"Forbidden"
            answer = searxng_answer(asked.get("q", [""])[0], results)
            return 200, {"Content-Type": "application/json"}, json.dumps(answer).encode()

        self._add_with_query(path, respond)

    def hits(self, path: str) -> int:
        with self._lock:
            return self._hits.get(path, 0)

    def _add(self, path: str, respond: Callable[[int], Response]) -> None:
        self._add_with_query(path, lambda n, _query: respond(n))

    def _add_with_query(self, path: str, respond: Callable[[int, str], Response]) -> None:
        if not path.startswith("/"):
            raise ValueError(f"page paths start with '/': {path!r}")
        with self._lock:
            self._routes[path] = _Route(respond)

    # -- addresses and lifecycle ----------------------------------------------------------

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("PageServer is not started")
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, path: str = "/") -> str:
        return self.base_url + (path if path.startswith("/") else "/" + path)

    def start(self) -> PageServer:
        if self._httpd is not None:
            return self
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self))
        httpd.daemon_threads = True
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is None:
            return
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = None
        self._thread = None

    def __enter__(self) -> PageServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _dispatch(self, raw_path: str) -> Response:
        parts = urlsplit(raw_path)
        path = parts.path
        with self._lock:
            route = self._routes.get(path)
            if route is None:
                return 404, {"Content-Type": "text/plain; charset=utf-8"}, b"not found"
            count = self._hits.get(path, 0) + 1
            self._hits[path] = count
        return route.respond(count, parts.query)


def _make_handler(server: PageServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            status, headers, body = server._dispatch(self.path)
            try:
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Cache-Control", "no-store")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (a timeout test); nothing to answer

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler
