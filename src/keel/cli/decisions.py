"""`keel answer`: a person's text in place of a paused call's tool (ADR 0052); and the edited
arguments `keel approve --arguments` reads. `keel approve`/`keel deny` live in `inspect.py`."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from keel.cli.common import ByOption, StoreOption, err, guard, open_run_store, usage_error

__all__ = ["answer", "edited_arguments"]


def edited_arguments(text: str) -> dict[str, Any]:
    """The JSON object given to `--arguments`, or a usage error saying why it is not one."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        usage_error(f"--arguments is not JSON: {exc}")
    except RecursionError:  # deeper than the decoder goes: no call's arguments are
        usage_error("--arguments is nested too deep: a call's arguments nest at most 64 levels")
    if not isinstance(value, dict):
        usage_error("--arguments must be a JSON object: the call's whole arguments")
    return value


def answer(
    run_id: Annotated[str, typer.Argument(help="The paused run.")],
    call_id: Annotated[str, typer.Argument(help="The call to answer, by Keel's id (e.g. k2_0).")],
    text: Annotated[str, typer.Argument(help="The call's result, in place of its tool's.")],
    by: ByOption = None,
    store: StoreOption = None,
) -> None:
    """Answer a pending call yourself: TEXT becomes its result and the tool is not run. Final,
    like an approval; `keel resume` then goes on."""
    from keel import approvals
    from keel.pool.commands import after_decision

    db = open_run_store(store)
    try:
        guard(lambda: approvals.answer(db, run_id, call_id, text, by))
    finally:
        db.close()
    typer.echo(f"answered {call_id}")
    err.print(guard(lambda: after_decision(store, run_id)), highlight=False)
