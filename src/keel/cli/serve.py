"""`keel serve`: the agent `keel run`'s options describe, served to other agents over A2A
(ADR 0040) and to front ends over AG-UI (ADR 0041) until interrupted.

It takes every agent option `keel run` takes (`--model`, `--repo`, `--allow-writes`,
`--approve-tools`, the limits, `--output-schema`, `--store`, ...) and builds its agent with the
same function (`command_agent`), so the two never drift apart. Each A2A task is then a run of
that agent.

It listens on 127.0.0.1 unless `--host` says otherwise; beyond loopback it refuses to start
without a bearer token (`--token` or KEEL_SERVE_TOKEN), since whoever reaches the port could
otherwise run the agent's tools. The web libraries (the `serve` extra) are imported only when
the command runs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from keel.cli.common import err, guard, usage_error
from keel.cli.flags import command_agent, with_agent_options

if TYPE_CHECKING:  # the command line starts without the run core (ADR 0042)
    from keel.agent import Agent
    from keel.cli.integrations import RunExtras

__all__ = ["DEFAULT_PORT", "TOKEN_ENV", "serve"]

DEFAULT_PORT = 8351
TOKEN_ENV = "KEEL_SERVE_TOKEN"


@with_agent_options(output=("otel", "otel_content"))
def serve(
    host: Annotated[
        str, typer.Option(help="Address to listen on; beyond loopback a token is required.")
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option(min=0, max=65535, help="Port to listen on (0: any free port).")
    ] = DEFAULT_PORT,
    token: Annotated[
        str | None,
        typer.Option(
            help=f"Bearer token every request must carry [default: {TOKEN_ENV}; none on loopback]."
        ),
    ] = None,
    **options: Any,
) -> None:
    """Serve the agent that `keel run`'s options describe to other agents over A2A (JSON-RPC
    and HTTP+JSON; the card at /.well-known/agent-card.json) and to front ends over AG-UI
    (POST /ag-ui), until interrupted. Each task is a run in the store."""
    token = token or os.environ.get(TOKEN_ENV) or None
    try:
        from keel.ui.security import is_loopback
    except ImportError as exc:
        usage_error(f"keel serve needs its extra: pip install 'keel-runtime[serve]' ({exc})")
    if token is None and not is_loopback(host):  # before anything starts or opens
        usage_error(f"--host {host} listens beyond loopback: give a token (--token or {TOKEN_ENV})")
    from keel.store import store_target

    built = command_agent(options)
    target = str(guard(lambda: store_target(built.resolved.values["store"])))
    _serve(built.agent, built.extras, target, host, port, token)


def _serve(
    agent: Agent, extras: RunExtras, target: str, host: str, port: int, token: str | None
) -> None:
    from keel.store import store_target

    try:
        from keel.serve.ag_ui import ag_ui_routes
        from keel.serve.runs import RunService
        from keel.serve.server import serve
    except ImportError as exc:
        usage_error(f"keel serve needs its extra: pip install 'keel-runtime[serve]' ({exc})")
    if isinstance(store_target(target), Path) and not Path(target).parent.is_dir():
        usage_error(f"no folder for the store {target}")
    guard(lambda: agent.store)  # a store that cannot open is one line, before listening
    # Served runs print nothing here: no progress lines, no answer written to the terminal
    # (the live files `keel ui` reads stay).
    agent.listeners = ()
    agent.text_listeners = tuple(t for t in agent.text_listeners if t is not extras.live)
    guard(extras.start_export)  # --otel, as keel run's: stopped (spans flushed) with extras
    with extras, agent:
        service = RunService(agent, target)
        try:
            serve(service, host, port, token, announce=_announce, extra_routes=ag_ui_routes(agent))
        except ValueError as exc:
            usage_error(str(exc))
        except OSError as exc:
            usage_error(f"cannot listen on {host}:{port}: {exc.strerror or exc}")


def _announce(url: str) -> None:
    typer.echo(url, err=False)
    err.print(
        f"serving A2A at {url}/a2a/jsonrpc (card: {url}/.well-known/agent-card.json)"
        f" and AG-UI at {url}/ag-ui",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )
