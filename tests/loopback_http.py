"""What the tests' small loopback HTTP servers share: a handler that logs nothing and answers
with one body, and serving on a daemon thread for as long as a `with` block lasts."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar

__all__ = ["QuietHandler", "serving"]

S = TypeVar("S", bound=ThreadingHTTPServer)


class QuietHandler(BaseHTTPRequestHandler):
    """Keeps the test output clean: no line per request on stderr."""

    def reply(self, body: bytes, content_type: str = "application/json") -> None:
        """A 200 with `body`, its length given so the client need not wait for a close."""
        self.send_response(200)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def serving(server: S, join_timeout: float = 5) -> Iterator[S]:
    """`server` answering on a daemon thread inside the block; shut down and closed after."""
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(join_timeout)
