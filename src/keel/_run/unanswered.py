"""A synthesis turn's reply that is no answer, and what the run ends with instead (PC-02,
ADR 0065).

A synthesis turn (tool_choice "none") exists to give the run's answer. Two replies seen from
llama.cpp's servers are not one: a tool call written as text (a chat template's pseudo-call,
`keel.transports.text_calls`), and Keel's own control repeated back (the
chatml-function-calling template parroted the citation instruction). Neither is stored as the
answer, and neither fails the run, whose limit left it this one turn to answer: the turn is
asked once more with a stricter control when the limits allow one more model call (never at
the deadline, whose synthesis turn had time for one reply), and
otherwise (or when the second reply is no answer either) the run ends with an answer built
from its record, which says no answer was written, why, and which results the run holds.

Every check here is linear in the model's text (ADR 0062).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from keel._run.synthesis import CONTROLS
from keel.messages import SynthesisReason, ToolResult
from keel.transports.text_calls import read_text_calls

__all__ = ["STRICTER_CONTROL", "built_answer", "not_an_answer"]

STRICTER_CONTROL = (
    "Reply with the answer itself, in plain sentences, from the tool results above. No tool "
    "can be called in this reply: write no call, and no part of these instructions."
)
"""Added to a synthesis turn asked again after a reply that was no answer. Imperatives only,
like every control (ADR 0036)."""

ECHO_WORDS = 8
"""This many words of a control, in order, in a reply make it a repetition of the control."""

MAX_LISTED_RESULTS = 12
"""A built answer names at most this many of the run's results."""

_WHY_SYNTHESIS = {
    SynthesisReason.REPEATED_TOOL: "the research was repeating a call",
    SynthesisReason.BUDGET: "a budget allowed one more model call only",
    SynthesisReason.DEADLINE: "the deadline left time for one more reply only",
    SynthesisReason.CONTEXT: "the model's window left room for an answer only",
}


def _words(text: str) -> list[str]:
    """The text's words, lower case: letters, digits and apostrophes (no pattern: the run
    core compiles none, tests/test_import_graph.py)."""
    kept = "".join(c if c.isalnum() or c == "'" else " " for c in text.lower())
    return kept.split()


def _runs(text: str) -> Iterable[tuple[str, ...]]:
    words = _words(text)
    return (tuple(words[i : i + ECHO_WORDS]) for i in range(len(words) - ECHO_WORDS + 1))


_CONTROL_RUNS = frozenset(
    run for control in (*CONTROLS, STRICTER_CONTROL) for run in _runs(control)
)


def not_an_answer(text: str | None, tools: Collection[str]) -> str | None:
    """Why the reply `text` of a synthesis turn is no answer, or None when it is one."""
    if not text or not text.strip():
        return None
    found = read_text_calls(text, tools)
    if found is not None:
        names = sorted({name for name, _ in found.calls})
        what = f"a call to {', '.join(names)}" if names else "a tool call"
        how = found.format if found.problem is None else f"{found.format}; {found.problem}"
        return (
            f"the model wrote {what} as text ({how}) where no tool can be called, so the call "
            "could not be made"
        )
    if any(run in _CONTROL_RUNS for run in _runs(text)):
        return "the model repeated Keel's instructions for the turn instead of answering"
    return None


def built_answer(
    why: str, reason: SynthesisReason, results: list[tuple[str, ToolResult]]
) -> str:
    """The run's answer when its synthesis turn gave none: what happened, from the record."""
    first = (
        f"No answer was written. This run's last turn was for its answer only "
        f"({_WHY_SYNTHESIS[reason]}), and {why}: that reply is not kept as the answer."
    )
    if not results:
        return f"{first} The run holds no tool results."
    listed = [f"[{ref}] {result.name}" for ref, result in results[:MAX_LISTED_RESULTS]]
    more = len(results) - len(listed)
    tail = f", and {more} more" if more > 0 else ""
    return (
        f"{first} The run's tool results are in its record ({', '.join(listed)}{tail}): "
        "they hold what was found."
    )
