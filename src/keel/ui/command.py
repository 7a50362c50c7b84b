"""`keel ui`: serve the web view of a store on this machine and print its URL.

Registered by the command line in one line, ``app.command("ui")(ui_command)``. The store is
found as `keel show` finds it (`--store`, `KEEL_STORE`, the trusted `keel.toml`, the default
file), a SQLite path or a `postgresql://` URL; a store that cannot be opened is one line and exit
code 2, naming a URL without its password. The web libraries (the `ui` extra) are imported only
when the command runs. It listens on 127.0.0.1
unless `--host` says otherwise, and then warns: whoever can reach that address can read every
run and approve calls.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, NoReturn

import typer

from keel.errors import KeelError

__all__ = ["DEFAULT_PORT", "ui_command"]

DEFAULT_PORT = 8350


def ui_command(
    store: Annotated[
        str | None,
        typer.Option(
            "--store",
            help="SQLite file or postgresql:// URL of the runs [default: KEEL_STORE, keel.toml, "
            "or a file under the user data directory]",
        ),
    ] = None,
    port: Annotated[
        int, typer.Option(min=0, max=65535, help="Port to listen on (0: any free port).")
    ] = DEFAULT_PORT,
    host: Annotated[
        str,
        typer.Option(help="Address to listen on; anything but loopback is reachable by others."),
    ] = "127.0.0.1",
) -> None:
    """Open a local web view of the runs: timelines, counters, approvals, live runs."""
    from keel.store import store_target  # here, not at import: `keel --help` (ADR 0042)

    try:
        target = store_target(store)
    except KeelError as exc:
        _fail(str(exc))
    if isinstance(target, Path) and not target.exists():
        _fail(f"no store at {target} (run `keel run` first)")
    try:
        from keel.ui.server import serve
    except ImportError as exc:
        _fail(f"the web view needs its extra: pip install 'keel-runtime[ui]' ({exc})")
    from keel.ui.security import is_loopback

    if not is_loopback(host):
        typer.echo(
            f"keel ui: warning: listening on {host}, not loopback: anyone who can reach it can "
            "read every run in the store and approve or deny calls",
            err=True,
        )
    try:
        serve(target, host, port, announce=lambda url: typer.echo(url))
    except KeelError as exc:  # the store: messages name it by its redacted URL
        _fail(str(exc))
    except OSError as exc:
        _fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}")


def _fail(message: str) -> NoReturn:
    typer.echo(f"keel: {message}", err=True)
    raise typer.Exit(2)
