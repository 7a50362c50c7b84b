"""What a batch does with the decisions people made on its calls (ADR 0052).

    expire(parts, batch)          pauses past their expiry become denials, recorded
    apply(parts, batch)           bound decisions take effect: edited arguments replace the
                                  model's (the counters re-keyed once), mismatched ones refused
    answered(parts, call)         an "answer instead": the person's text as the call's result

A decision is bound to the call it was given for: its tool and the key of its canonical
arguments are recorded with it (`Decision.name`, `Decision.call_key`). A stored decision whose
call does not match the open call of that id is refused: the call is answered with an error
and never runs on it.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Protocol

from keel._run.parts import StepParts
from keel.canonical import call_key, canonical_json
from keel.messages import ToolCall, ToolResult, digest_text
from keel.records import ApprovalDecided, Decision
from keel.store.protocol import expired_denial

__all__ = ["answered", "apply", "expire", "rekey", "with_arguments"]


class _Batch(Protocol):
    """What this module needs of `keel._run.batch.Batch` (which imports this module)."""

    calls: list[ToolCall]
    refused: dict[str, str]

    def open_calls(self) -> list[ToolCall]: ...


def expire(parts: StepParts, batch: _Batch) -> None:
    """Calls of this run whose pause passed its expiry with nobody deciding: denied now, the
    denial recorded as if it had been decided (its event `expired`)."""
    state, now = parts.state, time.time()
    open_ids = {c.id for c in batch.open_calls()}
    for asked in state.pending:
        if asked.run_id is not None or asked.call_id not in open_ids:
            continue  # a child's call expires in the child
        if asked.expires_at is None or now <= asked.expires_at:
            continue
        if asked.call_id in state.decisions:
            continue
        denial = expired_denial(asked.expires_at)
        parts.recorder.emit(  # the ledger records the denial in the state
            ApprovalDecided(
                step=state.step,
                call_id=asked.call_id,
                name=asked.name,
                call_key=asked.call_key,
                approved=False,
                by=denial.by,
                reason=denial.reason,
                expired=True,
            )
        )


def apply(parts: StepParts, batch: _Batch) -> None:
    """Each open call's decision, checked against the call and put into effect."""
    state = parts.state
    for index, call in enumerate(batch.calls):
        decision = state.decisions.get(call.id)
        if decision is None or call.id not in {c.id for c in batch.open_calls()}:
            continue
        if not bound_to(decision, call):
            batch.refused[call.id] = mismatch_text(call, decision)
            continue
        if decision.approved and decision.arguments is not None:
            edited = with_arguments(call, decision.arguments)
            rekey(parts, call, edited)
            batch.calls[index] = edited


def bound_to(decision: Decision, call: ToolCall) -> bool:
    """Whether `decision` was given for `call`: same tool, same canonical arguments. Decisions
    recorded before they were bound (no key) are taken as given for their call id."""
    if decision.call_key is None:
        return True
    return decision.call_key == call.key and decision.name in (None, call.name)


def mismatch_text(call: ToolCall, decision: Decision) -> str:
    return (
        f"Error: the decision recorded for {call.id} ({decision.by}) was given for another "
        f"call ({(decision.call_key or '')[:200]}), not for {call.key[:200]}. The call was "
        "not run."
    )


def with_arguments(call: ToolCall, arguments: object) -> ToolCall:
    """`call` as it runs with `arguments` instead of the model's: same ids, its own key."""
    return replace(
        call,
        raw_arguments=canonical_json(arguments),
        arguments=arguments,
        parse_error=None,
        key=call_key(call.name, arguments),
    )


def rekey(parts: StepParts, asked: ToolCall, runs: ToolCall) -> None:
    """The loop counters count what runs: the asked call's count moves to the key of the call
    that runs instead, once per call (`RunState.ran_as` remembers it across a resume)."""
    state = parts.state
    if asked.key == runs.key or asked.id in state.ran_as:
        return
    state.ran_as[asked.id] = runs.key
    parts.breaker.uncount(asked.key)
    for restart in parts.breaker.record([runs.key]):
        parts.recorder.restarted(restart)


def answered(parts: StepParts, call: ToolCall, decision: Decision) -> ToolResult:
    """The call's result when a person answered it instead: their text, and who they are."""
    text = decision.answer or ""
    result = ToolResult(
        call.id, call.name, call.key, text, size=len(text), digest=digest_text(text)
    )
    parts.recorder.tool_result(result, answered_by=decision.by)
    return result
