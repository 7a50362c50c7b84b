"""An answer's citations checked when it is written (ADR 0053, ADR 0058): checked, recorded,
and under `--citations require` sent back once.

The check itself is pure (keel/citations.py); this module feeds it the run's results from the
context builder (each with its citable id and its stored text, elided or not) and decides what
the step does with the outcome:

- `off`: nothing is checked; `report`: the outcome goes with the answer (result, event, trace);
- `require`: an answer with a failed quote or an unknown id gets exactly one more turn, the
  failures named in a volatile control (`evidence_feedback`), its text kept in the history as
  a resume replays it (`EvidenceRejected`). The answer after that is kept whatever its check
  says; if it still fails, it is `partial` with the failures as its gaps. A synthesis turn
  forced by the budget or the deadline has no turn after it: its answer is kept the same way.
"""

from __future__ import annotations

import dataclasses

from keel._run.context import ContextBuilder
from keel._run.parts import Completed, Continue, StepOutcome, StepParts
from keel._run.synthesis import Mode
from keel.citations import CitationCheck, Source, check_answer, check_output
from keel.hosted import citations
from keel.messages import AssistantMessage, ModelResponse, SynthesisReason
from keel.records import EvidenceRejected

__all__ = ["bind", "citation_feedback", "sources"]

_FEEDBACK_ITEMS = 10
"""Failures named in the control, at most; the rest are counted."""


def sources(context: ContextBuilder) -> list[Source]:
    """The run's citable results: id, call and stored text (never a pointer)."""
    return [
        Source(ref, r.name, r.call_key, r.content, r.call_id in context.elided, r.call_id)
        for ref, r in context.results()
    ]


def check(parts: StepParts, completed: Completed) -> CitationCheck:
    found = sources(parts.context)
    if completed.output is not None:
        return check_output(completed.output, found, completed.gaps)
    return check_answer(completed.answer, found)


def bind(
    parts: StepParts, response: ModelResponse, mode: Mode, completed: Completed
) -> StepOutcome:
    """The answer with its check, or another turn when `require` asks for one; with the
    sources its provider marked it as citing (ADR 0067), whatever the check says."""
    completed = dataclasses.replace(completed, sources=citations(response.provider_details))
    policy = parts.limits.citations
    if policy == "off":
        return completed
    checked = check(parts, completed)
    shown = checked.to_dict()
    if policy == "report" or checked.passed:
        return dataclasses.replace(completed, evidence=shown)
    state = parts.state
    if state.evidence_retries < 1 and mode.reason in (None, SynthesisReason.REPEATED_TOOL):
        feedback = citation_feedback(checked)  # the retry is counted by the ledger
        state.evidence_feedback = feedback
        parts.context.append(AssistantMessage(response.text))  # as a resume replays it
        parts.recorder.emit(
            EvidenceRejected(step=state.step, text=response.text, feedback=feedback, evidence=shown)
        )
        return Continue()
    gaps = (*completed.gaps, *checked.failures())
    return dataclasses.replace(completed, evidence=shown, gaps=gaps, unsupported=True)


def citation_feedback(checked: CitationCheck) -> str:
    """The volatile control of the one more turn: what failed, and what to do about it."""
    failures = checked.failures()
    named = "; ".join(failures[:_FEEDBACK_ITEMS])
    more = len(failures) - _FEEDBACK_ITEMS
    if more > 0:
        named += f"; and {more} more"
    return (
        f"Correct your last answer before it is final, where its citations do not check "
        f"against this run's tool results: {named}. Reply with the whole corrected answer: "
        "cite only the ids the results begin with, and quote only words that stand in the "
        "result you cite, or drop the quote."
    )
