"""One step of the run loop as a function: explicit parts in, one outcome out.

    take_step(parts, batch) -> Continue | Completed | Paused | Failed

A step (docs/design.md, "One step of the run loop") stops the run if it is past its limits, asks
the model for a turn in the mode the counters and budgets decide, ends the run with an answer, or
checks the batch against the hard breaker and answers it (approvals, dispatch, results,
evidence resets). The loop matches on the outcome and checkpoints; nothing here keeps state
between steps except what `StepParts` holds.
"""

from __future__ import annotations

from typing import Any, assert_never

from keel._run import batch as batches
from keel._run import turns
from keel._run.breaker import tier_of
from keel._run.budgets import past_limits
from keel._run.citing import bind
from keel._run.parts import Completed, Continue, Failed, Paused, StepOutcome, StepParts
from keel._run.synthesis import Mode
from keel.errors import (
    BudgetExhausted,
    ContextExhausted,
    DeadlineExceeded,
    InvalidOutput,
    RunFailure,
    ToolLoopDetected,
)
from keel.failpoints import failpoint
from keel.messages import AssistantMessage, ModelResponse, SynthesisReason, ToolCall, UserMessage
from keel.records import OutputRejected, ToolCallRequested
from keel.structured import VALIDATION_SECONDS, Checked, OutputSpec, ValidationTooCostly

MIN_VALIDATION_SECONDS = 0.1
"""Even an answer that came in at the deadline gets this long to validate: the answer is
there, and a cheap schema takes milliseconds."""

__all__ = [
    "Completed",
    "Continue",
    "Failed",
    "Paused",
    "StepOutcome",
    "StepParts",
    "take_step",
]


async def take_step(parts: StepParts, batch: batches.Batch | None) -> StepOutcome:
    """One step; `batch` is a batch left open by a pause or a crash, answered first."""
    try:
        if batch is None:
            parts.state.step += 1
            failpoint("step_start")
            response, mode = await turns.next_turn(parts)
            if not response.tool_calls:
                return await _answered(parts, response, mode)
            batch = _accept_batch(parts, response, mode)
        pending = await batches.answer(parts, batch)
    except RunFailure as failure:
        return Failed(failure)
    if parts.state.waiting:  # children queued for the workers are still open (ADR 0069)
        return Paused(pending, children=True)
    return Paused(pending) if pending else Continue()


async def _answered(parts: StepParts, response: ModelResponse, mode: Mode) -> StepOutcome:
    """An answer ends the run; with an output schema, only one that validates (ADR 0034). An
    invalid answer gets its errors back and another turn, at most `Limits.output_retries`
    times, a synthesis turn's too while the limits allow one more model call (ADR 0048); past
    that the run fails InvalidOutput with the model's text."""
    spec = parts.output
    if spec is None:
        return bind(parts, response, mode, Completed(response.text, mode.reason, response.cut_off))
    synthesis = mode.reason is not None
    checked = await _validated(parts, spec, response.text, synthesis)
    if isinstance(checked, Checked):
        completed = Completed(
            response.text, mode.reason, response.cut_off, checked.value, checked.gaps
        )
        return bind(parts, response, mode, completed)  # checked against the record (ADR 0053)
    state, limits = parts.state, parts.limits
    blocked = past_limits(state, limits, parts.clock) if synthesis else None
    if state.output_retries < limits.output_retries and blocked is None:
        feedback = output_feedback(checked, synthesis)
        parts.context.append(AssistantMessage(response.text))  # as a resume replays it
        parts.context.append(UserMessage(feedback))
        parts.recorder.emit(OutputRejected(step=state.step, text=response.text, feedback=feedback))
        return Continue()
    where = "synthesis turn" if synthesis else "answer"
    tries = f" after {state.output_retries} retries"
    if blocked is not None and state.output_retries < limits.output_retries:
        tries = f", and no model call was left for a retry ({blocked.message})"
    return Failed(
        InvalidOutput(
            f"the model's {where} did not match the output schema {spec.name}{tries}: "
            f"{checked[:500]}",
            step=state.step,
            details={
                "schema": spec.name,
                "errors": checked,
                "text": response.text,
                "synthesis": None if mode.reason is None else mode.reason.value,
            },
        )
    )


async def _validated(
    parts: StepParts, spec: OutputSpec, text: str | None, synthesis: bool
) -> Checked | str:
    """The answer checked off the event loop, in at most VALIDATION_SECONDS or the time left
    before the deadline: past the deadline the run fails DeadlineExceeded, and a validation
    too costly for its time is an invalid answer."""
    remaining = parts.clock.remaining()
    seconds = VALIDATION_SECONDS if remaining is None else min(VALIDATION_SECONDS, remaining)
    try:
        return await spec.check_bounded(text, synthesis, max(seconds, MIN_VALIDATION_SECONDS))
    except ValidationTooCostly as exc:
        stop = past_limits(parts.state, parts.limits, parts.clock)
        if isinstance(stop, DeadlineExceeded):
            raise stop from None
        return (
            f"{exc}: the schema is too costly to check against this answer; reply with a "
            "simpler JSON value that matches it"
        )


def output_feedback(errors: str, synthesis: bool = False) -> str:
    """What the model is told when its answer does not match the schema."""
    if synthesis:
        return (
            f"Your answer does not match the required output schema: {errors}. Reply again "
            f'with only the JSON object: "output" in the schema, "gaps" a list of strings.'
        )
    return (
        f"Your answer does not match the required output schema: {errors}. Reply again with "
        "only a JSON value that matches the schema (no prose around it), or call a tool if "
        "you need more evidence first."
    )


def _accept_batch(parts: StepParts, response: ModelResponse, mode: Mode) -> batches.Batch:
    """Refuse tools in a synthesis turn, run the hard breaker, then count and log the calls."""
    if mode.reason is not None:
        raise _synthesis_refusal(parts, response, mode)
    parts.context.append(
        AssistantMessage(response.text, response.tool_calls, response.provider_details)
    )
    calls = list(response.tool_calls)
    _check_breaker(parts, calls)
    for restart in parts.breaker.record([call.key for call in calls]):
        parts.recorder.restarted(restart)
    for call in calls:
        tool = parts.executor.get(call.name)
        parts.recorder.emit(
            ToolCallRequested(
                step=parts.state.step,
                call_id=call.id,
                name=call.name,
                arguments=call.arguments if call.parse_error is None else call.raw_arguments,
                call_key=call.key,
                effect=None if tool is None else tool.effect.value,
            )
        )
    return batches.Batch(calls)


def _synthesis_refusal(parts: StepParts, response: ModelResponse, mode: Mode) -> RunFailure:
    """A tool request in a synthesis turn: the failure kind follows from why it was one."""
    names = sorted({c.name for c in response.tool_calls})
    step = parts.state.step
    reason = mode.reason
    match reason:
        case SynthesisReason.BUDGET:
            return BudgetExhausted(
                f"the {mode.budget} budget allowed only a final answer, but the model asked "
                f"for {', '.join(names)} instead; nothing was run",
                step=step,
                details={"reason": reason.value, "requested": names, "budget": mode.budget},
            )
        case SynthesisReason.DEADLINE:
            deadline = parts.limits.deadline
            return DeadlineExceeded(
                f"the deadline of {deadline:g}s left time only for a final answer, but the "
                f"model asked for {', '.join(names)} instead; nothing was run",
                step=step,
                details={"reason": reason.value, "requested": names, "deadline": deadline},
            )
        case SynthesisReason.CONTEXT:
            return ContextExhausted(
                f"the model's window left room only for a final answer, but the model asked "
                f"for {', '.join(names)} instead; nothing was run",
                step=step,
                details={"reason": reason.value, "requested": names, "limit": parts.context.limit},
            )
        case SynthesisReason.REPEATED_TOOL:
            key = mode.repeated_key or ""
            count = parts.breaker.count(key)
            tier = tier_of(key)
            details: dict[str, Any] = {
                "reason": reason.value,
                "requested": names,
                "call_key": key,
                "count": count,
                "threshold": parts.limits.loop_threshold,
            }
            if tier is not None:
                details["tier"] = tier
            return ToolLoopDetected(
                f"research was repeating ({key[:120]} was requested {count} times) and the "
                f"model asked for {', '.join(names)} in its final synthesis turn instead of "
                "answering; nothing was run",
                step=step,
                details=details,
            )
        case None:
            raise AssertionError("a normal turn's tool calls are not a synthesis refusal")
        case _:
            assert_never(reason)


def _check_breaker(parts: StepParts, calls: list[ToolCall]) -> None:
    tripped = parts.breaker.first_tripping_key([c.key for c in calls], [c.name for c in calls])
    if tripped is None:
        return
    key, count = tripped
    threshold = parts.limits.loop_threshold
    tier = tier_of(key)
    details: dict[str, Any] = {"call_key": key, "count": count, "threshold": threshold}
    what = f"the identical call {key[:120]}"
    if tier is not None:  # docs/adr/0050
        details["tier"] = tier
        what = f"a call that repeats ({_TIER_WORDS[tier]}, {key[:120]})"
    raise ToolLoopDetected(
        f"the model requested {what} a {_ordinal(count)} time, "
        f"reaching the limit of {threshold}; the batch of {len(calls)} call(s) was not run",
        step=parts.state.step,
        details=details,
    )


_TIER_WORDS = {
    "same_result": "the same result under other arguments",
    "alternation": "calls taking turns with unchanged results",
    "same_error": "the same error under other arguments",
}


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
