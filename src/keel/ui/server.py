"""Serving the web view with uvicorn on a socket bound here, so `--port 0` works: the URL
printed, and the Host names the guard accepts, carry the port actually bound."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import uvicorn

from keel.ui.app import create_app
from keel.ui.security import served_hosts

__all__ = ["bind", "serve"]

SHUTDOWN_SECONDS = 2
"""Open live streams are closed this long after Ctrl-C, at most."""


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


class _Server(uvicorn.Server):
    """Tells the app when Ctrl-C (or SIGTERM) came, so its live streams end promptly."""

    def __init__(self, config: uvicorn.Config, on_exit: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_exit = on_exit

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self._on_exit()
        super().handle_exit(sig, frame)


def serve(store: str | Path, host: str, port: int, announce: Callable[[str], None]) -> None:
    """Serve until interrupted; `announce` gets the URL once the socket listens and the store
    is open (StoreError when it cannot be)."""
    sock = bind(host, port)
    bound = sock.getsockname()[1]
    try:
        app = create_app(store, served_hosts(host, bound))
    except BaseException:
        sock.close()
        raise
    name = f"[{host.strip('[]')}]" if ":" in host else host
    config = uvicorn.Config(
        app,
        log_level="warning",
        timeout_graceful_shutdown=SHUTDOWN_SECONDS,
        access_log=False,
    )
    announce(f"http://{name}:{bound}/")
    ui = app.state.ui

    def stop_streams() -> None:
        ui.stopping = True

    _Server(config, stop_streams).run(sockets=[sock])
