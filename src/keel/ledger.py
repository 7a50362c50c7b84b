"""The ledger: what each kind of event does to a run's derived state, said once.

A run's spend and the counters the breaker does not own (model calls, tool calls, usage, cost,
the costliest and the longest model call, output and evidence retries, effects left unknown,
decisions) follow from its events. The loop applies an event here as it records it
(`StepRecorder.emit`), the store as it records a person's decision, and a fork as it copies an
original's events (`keel._run.fork`): one fold, so a fork's state equals its original's field for
field. Every event kind is either handled here or declared inert; tests/test_ledger.py fails
when a new kind is neither. A child's spend is folded in by `fold_child`, from the child's
record, when the parent's batch ends (in the loop) or its result is copied (in a fork).

What is not here, and why: the identical-call counters and the repeat tiers belong to the
breaker (keel._run.breaker), which a fork replays with the breaker's own code; the history a
resumed run sends is rebuilt by keel._run.resume; denials by call key are the batch's rule.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from keel.records import (
    ApprovalDecided,
    ApprovalRequested,
    ContextShrunk,
    Decision,
    Event,
    EvidenceRejected,
    EvidenceReset,
    HookApplied,
    HostedToolCalled,
    ModelErrorSeen,
    ModelRequestSent,
    ModelResponseReceived,
    OutputRejected,
    ResultClamped,
    ResultElided,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunResumed,
    RunStarted,
    RunState,
    ToolCallRequested,
    ToolChoiceIgnored,
    ToolDispatched,
    ToolResultRecorded,
    UnknownEvent,
)
from keel.result import ChildRun

__all__ = ["HANDLED", "INERT", "apply", "decision_of", "fold_child", "spent_by"]


def _request(state: RunState, event: ModelRequestSent) -> None:
    state.model_calls += 1  # every attempt sent, retries and synthesis included
    state.last_request_tokens = event.estimated_input_tokens
    if event.synthesis is not None:
        state.answer_owed = False  # the turn it was owed


def _response(state: RunState, event: ModelResponseReceived) -> None:
    state.usage = state.usage + event.usage
    if event.cost is not None:
        state.cost = (state.cost or 0.0) + event.cost
        state.costliest_call = max(state.costliest_call, event.cost)
    if event.took is not None:
        state.longest_model_call = max(state.longest_model_call, event.took)


def _result(state: RunState, event: ToolResultRecorded) -> None:
    if spent_by(event, state.decisions):
        state.tool_calls += 1
    if event.uncertain:  # an identical call from here on waits for a person (ADR 0033)
        state.unknown_effects.setdefault(event.call_key, event.call_id)


def _hosted(state: RunState, event: HostedToolCalled) -> None:
    """A call the provider ran itself (ADR 0067): a tool call of the budget, and its price per
    call (billed apart from the turn's tokens, which its response event counted)."""
    state.tool_calls += 1
    if event.cost is not None:
        state.cost = (state.cost or 0.0) + event.cost


def _output_rejected(state: RunState, event: OutputRejected) -> None:
    state.output_retries += 1


def _evidence_rejected(state: RunState, event: EvidenceRejected) -> None:
    state.evidence_retries += 1


def _decided(state: RunState, event: ApprovalDecided) -> None:
    state.decisions.setdefault(event.call_id, decision_of(event))  # a decision is final


HANDLED: dict[type[Any], Callable[[RunState, Any], None]] = {
    ModelRequestSent: _request,
    ModelResponseReceived: _response,
    ToolResultRecorded: _result,
    HostedToolCalled: _hosted,
    OutputRejected: _output_rejected,
    EvidenceRejected: _evidence_rejected,
    ApprovalDecided: _decided,
}
"""Event kinds that change the derived state, each with what it does."""

INERT: frozenset[type[Any]] = frozenset(
    {
        RunStarted,  # the question: history (keel._run.resume)
        RunResumed,  # a process took over: nothing spent
        ModelErrorSeen,  # the attempt was counted when it was sent
        ToolCallRequested,  # the breaker counts keys (keel._run.breaker)
        ToolDispatched,  # the journal: its result spends, or a resume records it unknown
        ResultElided,  # the context builder's (elisions are saved beside the state)
        ResultClamped,  # what the request showed; the result is recorded whole
        ContextShrunk,  # the attempt was counted when it was sent
        ToolChoiceIgnored,  # a mark for readers
        EvidenceReset,  # the breaker's counter restart
        ApprovalRequested,  # the pause: the ending records it
        HookApplied,  # replayed by the hooks on resume (keel._run.hooks)
        RunCompleted,  # endings are taken whole (`RunState.end`)
        RunFailed,
        RunCancelled,
        UnknownEvent,  # written by a newer Keel: nothing this one can fold
    }
)
"""Event kinds that change none of the ledger's fields, each with why."""


def apply(state: RunState, event: Event) -> None:
    """Fold one event into `state` (its spend and the counters the breaker does not own)."""
    handler = HANDLED.get(type(event))
    if handler is not None:
        handler(state, event)


def fold_child(state: RunState, call_id: str, child: ChildRun) -> None:
    """Add what a child run spent to its parent's totals, once per delegating call."""
    if call_id in state.children:
        return
    state.model_calls += child.model_calls
    state.tool_calls += child.tool_calls
    state.usage = state.usage + child.usage
    if child.cost is not None:
        state.cost = (state.cost or 0.0) + child.cost
    state.delegations += 1 + child.delegations  # the child, and what its own tree started
    state.children[call_id] = child


def decision_of(event: ApprovalDecided) -> Decision:
    """The decision an `ApprovalDecided` event records, whole."""
    return Decision(
        event.approved,
        event.by,
        event.reason,
        event.at,
        name=event.name,
        call_key=event.call_key,
        arguments=event.arguments,
        answer=event.answer,
        for_run=event.for_run,
        expired=event.expired,
    )


BUDGET_REFUSAL = "not run: the run's tool-call budget is spent"
_NOT_RUN_ENDING = "The call was not run."


def spent_by(result: ToolResultRecorded, decisions: dict[str, Decision]) -> bool:
    """Whether a result's call counted against the tool-call budget: it ran (even into an
    error), or it was dispatched before a crash (its effect unknown). Runs record it with the
    result (`spent`); for runs stored before they did, it is read off the result as the loop
    wrote it: a denial, a refusal and a call the budget left unrun spent nothing."""
    if result.spent is not None:
        return result.spent
    if result.uncertain or not result.is_error:
        return result.answered_by is None
    decision = decisions.get(result.call_id)
    text = result.content
    if (decision is not None and not decision.approved) or text.startswith("Denied "):
        return False
    return not (text.startswith(BUDGET_REFUSAL) or text.endswith(_NOT_RUN_ENDING))
