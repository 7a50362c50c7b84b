"""`keel ask RUN_ID QUESTION`: a follow-up question on an ended run (ADR 0038), and how
`keel runs` and `keel show` present conversations.

`keel ask` takes every `keel run` option (the follow-up is a run of its own, with its own
limits), plus `--fork`; it is `keel run` with the run to continue, so both stay one command.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer

from keel.present.terminal import safe_text

if TYPE_CHECKING:
    from keel.store import RunRecord

__all__ = ["ask_command", "continues_line", "conversation_lines"]

_RUN_ONLY = ("question", "submit_", "ask_run", "fork")
"""`keel run`'s parameters that `keel ask` replaces or does not offer."""


def ask_command(run: Callable[..., None]) -> Callable[..., None]:
    """The `keel ask` command: `run`'s options, RUN_ID and QUESTION first, `--fork` beside."""

    def ask(run_id: str, question: str, fork: bool = False, **options: Any) -> None:
        """Ask a follow-up QUESTION on run RUN_ID (completed or failed): a new run of the
        same conversation, whose history is the conversation so far. Takes every `keel run`
        option."""
        run(question=question, ask_run=run_id, fork=fork, **options)

    ask.__doc__ = (
        "Ask a follow-up QUESTION on run RUN_ID (completed or failed): a new run of the same "
        "conversation whose history is the conversation so far. Takes every `keel run` option."
    )
    kept = [
        p
        for p in inspect.signature(run, eval_str=True).parameters.values()
        if p.name not in _RUN_ONLY
    ]
    keyword = inspect.Parameter.KEYWORD_ONLY
    params = [
        inspect.Parameter(
            "run_id",
            keyword,
            annotation=Annotated[
                str, typer.Argument(metavar="RUN_ID", help="The ended run to continue.")
            ],
        ),
        inspect.Parameter(
            "question",
            keyword,
            annotation=Annotated[
                str, typer.Argument(metavar="QUESTION", help="The follow-up question.")
            ],
        ),
        *(p.replace(kind=keyword) for p in kept),
        inspect.Parameter(
            "fork",
            keyword,
            default=False,
            annotation=Annotated[
                bool,
                typer.Option(
                    "--fork",
                    help="Continue from a run the conversation already went on from, as a "
                    "new conversation.",
                ),
            ],
        ),
    ]
    ask.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    ask.__annotations__ = {p.name: p.annotation for p in params}
    return ask


def continues_line(record: RunRecord) -> str | None:
    """`keel show`'s line for a follow-up: where it continues from, in which conversation."""
    parent = record.config.continues_from
    if parent is None:
        return None
    if record.config.conversation_id is None:
        return f"continues from: {parent} (a fork: conversation {record.run_id} begins here)"
    return f"continues from: {parent} (conversation {record.conversation_id})"


def conversation_lines(records: list[RunRecord], line: Callable[[RunRecord], str]) -> list[str]:
    """`keel runs`: the runs of one conversation together, under the newest's place in the
    list, each follow-up indented under the run it continues."""
    groups: dict[str, list[RunRecord]] = {}
    for record in records:  # newest first; a conversation takes its newest run's place
        groups.setdefault(record.conversation_id, []).append(record)
    lines: list[str] = []
    for conversation, runs in groups.items():
        if len(runs) == 1 and runs[0].config.continues_from is None:
            lines.append(line(runs[0]))
            continue
        lines.append(f"conversation {conversation} ({len(runs)} runs listed)")
        for record in reversed(runs):  # oldest first within it
            mark = "  ↳ " if record.config.continues_from else "    "
            lines.append(mark + line(record))
    return [safe_text(text) for text in lines]
