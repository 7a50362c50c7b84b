"""A loopback HTTP server with scripted pages, for tests and offline evaluations.

Standard library only. It binds 127.0.0.1 on a free port and serves from a daemon thread:

    with PageServer() as server:
        server.add_page("/doc", "<h1>Hello</h1>")
        server.add_dynamic("/status", lambda n: "done" if n >= 3 else "running")
        fetch(server.url("/doc"))
        assert server.hits("/doc") == 1

Routes match on the URL path (the query string is ignored); an unknown path answers 404.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

HTML = "text/html; charset=utf-8"


@dataclass(frozen=True)
class _Route:
    respond: Callable[[int], tuple[int, dict[str, str], bytes]]
    """Given the 1-based hit count for the path: status, headers, body."""


def _encode(body: str | bytes) -> bytes:
    return body.encode("utf-8") if isinstance(body, str) else body


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

    def add_redirect(self, path: str, location: str, status: int = 302) -> None:
        self._add(path, lambda _n: (status, {"Location": location}, b""))

    def add_slow(
        self, path: str, seconds: float, body: str | bytes = "slow", content_type: str = HTML
    ) -> None:
        data = _encode(body)

        def respond(_n: int) -> tuple[int, dict[str, str], bytes]:
            time.sleep(seconds)
            return 200, {"Content-Type": content_type}, data

        self._add(path, respond)

    def hits(self, path: str) -> int:
        with self._lock:
            return self._hits.get(path, 0)

    def _add(self, path: str, respond: Callable[[int], tuple[int, dict[str, str], bytes]]) -> None:
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

    def _dispatch(self, raw_path: str) -> tuple[int, dict[str, str], bytes]:
        path = urlsplit(raw_path).path
        with self._lock:
            route = self._routes.get(path)
            if route is None:
                return 404, {"Content-Type": "text/plain; charset=utf-8"}, b"not found"
            count = self._hits.get(path, 0) + 1
            self._hits[path] = count
        return route.respond(count)


def _make_handler(server: PageServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            status, headers, body = server._dispatch(self.path)
            try:
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (a timeout test); nothing to answer

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler
