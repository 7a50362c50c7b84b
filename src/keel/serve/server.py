"""Listening: uvicorn on a socket bound here (so `--port 0` works and the card's URL carries
the port actually bound), as `keel ui` does."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable, Iterator, Sequence

import uvicorn
from starlette.routing import BaseRoute

from keel.serve.app import build_app
from keel.serve.runs import RunService
from keel.ui.security import is_loopback, served_hosts
from keel.ui.server import bind

__all__ = ["base_url", "serve"]

SHUTDOWN_SECONDS = 3
"""Open streams are closed this long after Ctrl-C (or SIGTERM), at most."""


class _Server(uvicorn.Server):
    """Ctrl-C or SIGTERM ends the serving, and the command with it (exit 0): uvicorn would
    raise the signal again once it has shut down, for the command's own handler to report
    as a run stopped before it started."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        with super().capture_signals():
            try:
                yield
            finally:
                self._captured_signals.clear()


def base_url(host: str, port: int) -> str:
    """The URL other agents reach this server at: a wildcard address names this machine."""
    if host in ("0.0.0.0", "::", ""):
        host = socket.getfqdn()
    name = f"[{host.strip('[]')}]" if ":" in host else host
    return f"http://{name}:{port}"


def serve(
    service: RunService,
    host: str,
    port: int,
    token: str | None,
    announce: Callable[[str], None],
    extra_routes: Sequence[BaseRoute] = (),
) -> None:
    """Serve until interrupted; `announce` gets the URL once requests are served. Refuses
    (ValueError) to listen beyond loopback without a token: anyone who can reach the port
    could otherwise run the agent's tools."""
    if token is None and not is_loopback(host):
        raise ValueError(
            f"--host {host} listens beyond loopback: give a token (--token or KEEL_SERVE_TOKEN)"
        )
    sock = bind(host, port)
    bound = sock.getsockname()[1]
    url = base_url(host, bound)
    try:
        app = build_app(
            service,
            base_url=url,
            hosts=served_hosts(host, bound),
            token=token,
            extra_routes=extra_routes,
            on_ready=lambda: announce(url),
        )
    except BaseException:
        sock.close()
        raise
    config = uvicorn.Config(
        app, log_level="warning", timeout_graceful_shutdown=SHUTDOWN_SECONDS, access_log=False
    )
    _Server(config).run(sockets=[sock])
