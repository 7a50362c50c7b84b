"""The commands of many machines: `keel submit`, `keel worker`, and what a decision does on a
Postgres store (the run is queued again for the workers). Only the Postgres store has workers;
on SQLite these say so, and a decision still ends with "continue with: keel resume"."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

from keel.errors import ConfigError, KeelError

if TYPE_CHECKING:  # `keel --help` lists `keel worker` without them (ADR 0042)
    from keel.agent import Agent

__all__ = ["after_decision", "submit_run", "worker_command"]


def _postgres(given: str | None, what: str) -> str:
    from keel.store import store_target
    from keel.store.locate import is_url

    target = store_target(given)
    if not is_url(target):
        raise ConfigError(f"{what} needs a postgresql:// store (--store, KEEL_STORE or keel.toml)")
    return str(target)


def submit_run(agent: Agent, question: str, as_json: bool) -> NoReturn:
    """Record the run as `queued` and enqueue it; print its id at once (exit code 0)."""
    from keel.agent import new_run_id
    from keel.pool.dispatch import Dispatch
    from keel.store.postgres_store import PostgresStore

    store = agent.store
    if not isinstance(store, PostgresStore):
        raise ConfigError(
            "keel submit needs a postgresql:// store (--store, KEEL_STORE or keel.toml)"
        )
    run_id = new_run_id()
    dispatch = Dispatch(store)
    try:
        queued = dispatch.submit(run_id, question, agent.transport.name, agent.config())
    finally:
        dispatch.close()
        agent.close()
    if as_json:
        typer.echo(json.dumps({"run_id": run_id, "status": "queued"}))
    else:
        typer.echo(run_id)
    if not queued:
        print(
            "the queue is not set up yet: the first `keel worker` to start takes it",
            file=sys.stderr,
        )
    raise typer.Exit(0)


def after_decision(given: str | None, run_id: str) -> str:
    """On Postgres, once no call waits for a decision, queue the run for the workers; the line
    to show says what happens next."""
    from keel.store import store_target
    from keel.store.locate import is_url

    target = store_target(given)
    if not is_url(target):
        return f"continue with: keel resume {run_id}"
    from keel.pool.dispatch import hand_on_decided

    decided = hand_on_decided(str(target), run_id)
    if decided.waiting:
        return f"{decided.waiting} calls still wait for a decision; then a worker continues"
    if not decided.queued:
        return (
            "no keel worker has set the queue up on this store yet: the first keel worker to "
            f"start takes it (or: keel resume {run_id})"
        )
    return f"queued: a keel worker continues run {run_id} (or: keel resume {run_id})"


def worker_command(
    store: Annotated[
        str | None, typer.Option("--store", help="The postgresql:// store the runs are in.")
    ] = None,
    concurrency: Annotated[
        int, typer.Option(help="Runs advanced at once by each worker (the pool's setting).")
    ] = 4,
    name: Annotated[
        str | None, typer.Option(help="This worker's name [default: host:pid].")
    ] = None,
    lease_ttl: Annotated[
        float, typer.Option(help="Seconds a dead worker's runs wait before another takes them.")
    ] = 30.0,
    otel: Annotated[
        bool,
        typer.Option(
            "--otel",
            help="Export each run's OpenTelemetry spans (OTLP/HTTP; "
            "OTEL_TRACES_EXPORTER=console for stderr), as keel run --otel does.",
        ),
    ] = False,
    otel_content: Annotated[
        bool,
        typer.Option(
            "--otel-content",
            help="Export spans with prompts, answers and tool input/output (implies --otel).",
        ),
    ] = False,
) -> None:
    """Run queued runs until stopped (SIGTERM or Ctrl-C: each run finishes its step, is saved,
    and is queued again for another worker)."""
    from keel.pool.worker import PoolWorker

    try:
        url = _postgres(store, "keel worker")
        worker = PoolWorker(
            url,
            concurrency=concurrency,
            name=name,
            lease_ttl=lease_ttl,
            say=lambda line: print(line, file=sys.stderr, flush=True),
        )
    except KeelError as exc:  # a bad URL, an unreachable database: one line, exit code 2
        _fail(str(exc))
    stop_export = _export(otel, otel_content)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        worker.serve(stop)
    finally:
        if stop_export is not None:
            stop_export()  # the spans still in the batch are sent
    raise typer.Exit(0)


def _export(otel: bool, content: bool) -> Callable[[], None] | None:
    """`--otel`/`--otel-content` (or an OTLP endpoint in the environment), as `keel run`'s
    (`keel.trace_export.start_export`). The runs a worker rebuilds take the content switch
    from the GenAI convention's variable, which `--otel-content` sets for this process."""
    from keel.trace_export import start_export
    from keel.trace_hooks import CONTENT_ENV

    if content:
        os.environ[CONTENT_ENV] = "true"
    try:
        return start_export(otel or content)
    except KeelError as exc:
        _fail(str(exc))


def _fail(message: str) -> NoReturn:
    print(f"keel: {message}", file=sys.stderr)
    raise typer.Exit(2)
