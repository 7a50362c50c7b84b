"""`keel cancel RUN`: a run and every run below it cancelled, durably (ADR 0066).

The store records the cancel in one transaction (keel/store/cancels.py): a run nobody
advances (paused, queued, its process gone) ends `cancelled` at once; a run a live process
advances is asked to, and that process stops it within half a second, its in-flight calls
cancelled. The command waits for those (`--wait`) and says how the tree ended.
"""

from __future__ import annotations

import time
from typing import Annotated

import typer

from keel.cli.common import JsonOption, StoreOption, guard, json_errors, open_run_store

__all__ = ["cancel"]


@json_errors
def cancel(
    run_id: Annotated[str, typer.Argument(help="The run's id, as `keel runs` lists it.")],
    wait: Annotated[
        float, typer.Option(help="Seconds to wait for runs a live process advances to stop.")
    ] = 10.0,
    as_json: JsonOption = False,
    store: StoreOption = None,
) -> None:
    """Cancel a run and every child run below it; `keel resume` can continue them later."""
    from keel.present.timeline import json_text

    db = open_run_store(store)
    try:
        asked = guard(lambda: db.request_cancel(run_id))
        left = _wait_ended(db, asked, wait)
    finally:
        db.close()
    cancelled = [r for r in asked if r not in left]
    if as_json:
        typer.echo(json_text({"run_id": run_id, "cancelled": cancelled, "stopping": left}))
        return
    plural = "" if len(cancelled) == 1 else "s"
    typer.echo(f"cancelled {len(cancelled)} run{plural} of the tree of {run_id}")
    if left:
        typer.echo(f"still stopping (their process cancels them): {', '.join(left)}")


def _wait_ended(db: object, run_ids: list[str], seconds: float) -> list[str]:
    """The runs of `run_ids` still not ended after at most `seconds`."""
    from keel.result import TERMINAL
    from keel.store import RunStore

    assert isinstance(db, RunStore)
    deadline = time.monotonic() + max(0.0, seconds)
    while True:
        left = [r for r in run_ids if (rec := db.get_run(r)) is None or rec.status not in TERMINAL]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.1)
