"""`keel ask RUN_ID QUESTION`: a follow-up question on an ended run (ADR 0038), and how
`keel runs` and `keel show` present conversations.

`keel ask` takes every agent option `keel run` takes (the follow-up is a run of its own, with
its own limits), plus `--fork`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer

from keel.cli.common import EXIT_CODES, err, guard, json_errors
from keel.cli.finish import announce, finish
from keel.cli.flags import command_agent, with_agent_options
from keel.cli.signals import stoppable
from keel.present.terminal import safe_text

if TYPE_CHECKING:
    from keel.store import RunRecord

__all__ = ["ask", "continues_line", "conversation_lines"]


@json_errors
@stoppable(EXIT_CODES, err)
@with_agent_options()
def ask(
    run_id: Annotated[str, typer.Argument(metavar="RUN_ID", help="The ended run to continue.")],
    question: Annotated[str, typer.Argument(metavar="QUESTION", help="The follow-up question.")],
    fork: Annotated[
        bool,
        typer.Option(
            "--fork",
            help="Continue from a run the conversation already went on from, as a new "
            "conversation.",
        ),
    ] = False,
    **options: Any,
) -> None:
    """Ask a follow-up QUESTION on run RUN_ID (completed or failed): a new run of the same
    conversation whose history is the conversation so far. Takes every `keel run` option."""
    from keel._run import FollowUp, continuation
    from keel.cli.common import usage_error

    if not question.strip():
        usage_error("the question is empty: say what to research")
    built = command_agent(options)
    agent = built.agent
    guard(lambda: agent.store)  # a store that cannot open is one line, before anything else
    # refused here (one line), before the header and any model load
    guard(lambda: continuation(agent.store, run_id, fork=fork))
    announce(built)
    finish(agent, lambda: agent.launch(FollowUp(run_id, question, fork)), built.extras)


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
