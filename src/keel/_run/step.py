"""One step of the run loop as a function: explicit parts in, one outcome out.

    take_step(parts, batch) -> Continue | Completed | Paused | Failed

A step (SYSTEM.md, "One step of the run loop") stops the run if it is past its limits, asks the
model for a turn in the mode the counters and budgets decide, ends the run with an answer, or
checks the batch against the hard breaker and answers it (approvals, dispatch, results,
evidence resets). The loop matches on the outcome and checkpoints; nothing here keeps state
between steps except what `StepParts` holds.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from keel import batch as batches
from keel import turns
from keel.breaker import IdenticalCallBreaker
from keel.budgets import Clock
from keel.context import ContextBuilder
from keel.errors import BudgetExhausted, RunFailure, ToolLoopDetected
from keel.failpoints import failpoint
from keel.limits import Limits
from keel.messages import AssistantMessage, ModelResponse, SynthesisReason, ToolCall
from keel.recorder import StepRecorder
from keel.records import RunState, ToolCallRequested
from keel.result import PendingApproval
from keel.synthesis import Mode
from keel.tools.executor import ToolExecutor
from keel.transports.base import Resumable, Transport

__all__ = [
    "Completed",
    "Continue",
    "Failed",
    "Paused",
    "StepOutcome",
    "StepParts",
    "take_step",
]


@dataclass(frozen=True, slots=True)
class Continue:
    """The batch was answered; checkpoint and take the next step."""


@dataclass(frozen=True, slots=True)
class Completed:
    answer: str | None
    synthesized: SynthesisReason | None
    cut_off: bool = False
    """The answer was cut at the model's output limit (kept, and said so)."""


@dataclass(frozen=True, slots=True)
class Paused:
    """Calls wait for a person's decision; the run pauses durably."""

    pending: tuple[PendingApproval, ...]


@dataclass(frozen=True, slots=True)
class Failed:
    failure: RunFailure


StepOutcome = Continue | Completed | Paused | Failed


@dataclass(slots=True)
class StepParts:
    """What a step works with: the run's state and the parts that act on it."""

    state: RunState
    breaker: IdenticalCallBreaker
    context: ContextBuilder
    recorder: StepRecorder
    transport: Transport
    executor: ToolExecutor
    limits: Limits
    clock: Clock
    approve_tools: frozenset[str]
    """Tools whose calls are pre-approved for this run."""
    checkpoint: Callable[[], Awaitable[None]]
    """Make the step so far durable (before a side effect, after one)."""
    resumable: Resumable | None = None
    """The transport, when its position is saved with each checkpoint (a script)."""

    def __post_init__(self) -> None:
        if isinstance(self.transport, Resumable):  # asked once: a protocol check is not free
            self.resumable = self.transport


async def take_step(parts: StepParts, batch: batches.Batch | None) -> StepOutcome:
    """One step; `batch` is a batch left open by a pause or a crash, answered first."""
    try:
        if batch is None:
            parts.state.step += 1
            failpoint("step_start")
            response, mode = await turns.next_turn(parts)
            if not response.tool_calls:
                return Completed(response.text, mode.reason, response.cut_off)
            batch = _accept_batch(parts, response, mode)
        pending = await batches.answer(parts, batch)
    except RunFailure as failure:
        return Failed(failure)
    return Paused(pending) if pending else Continue()


def _accept_batch(parts: StepParts, response: ModelResponse, mode: Mode) -> batches.Batch:
    """Refuse tools in a synthesis turn, run the hard breaker, then count and log the calls."""
    if mode.reason is not None:
        raise _synthesis_refusal(parts, response, mode)
    parts.context.append(
        AssistantMessage(response.text, response.tool_calls, response.provider_details)
    )
    calls = list(response.tool_calls)
    _check_breaker(parts, calls)
    parts.breaker.record(call.key for call in calls)
    for call in calls:
        parts.recorder.emit(
            ToolCallRequested(
                step=parts.state.step,
                call_id=call.id,
                name=call.name,
                arguments=call.arguments if call.parse_error is None else call.raw_arguments,
                call_key=call.key,
            )
        )
    return batches.Batch(calls)


def _synthesis_refusal(parts: StepParts, response: ModelResponse, mode: Mode) -> RunFailure:
    names = sorted({c.name for c in response.tool_calls})
    step = parts.state.step
    if mode.reason == "budget":
        return BudgetExhausted(
            f"the {mode.budget} budget allowed only a final answer, but the model asked for "
            f"{', '.join(names)} instead; nothing was run",
            step=step,
            details={"reason": mode.reason, "requested": names, "budget": mode.budget},
        )
    key = mode.repeated_key or ""
    count = parts.breaker.count(key)
    return ToolLoopDetected(
        f"research was repeating ({key[:120]} was requested {count} times) and the model asked "
        f"for {', '.join(names)} in its final synthesis turn instead of answering; nothing was "
        "run",
        step=step,
        details={
            "reason": mode.reason,
            "requested": names,
            "call_key": key,
            "count": count,
            "threshold": parts.limits.loop_threshold,
        },
    )


def _check_breaker(parts: StepParts, calls: list[ToolCall]) -> None:
    tripped = parts.breaker.first_tripping_key([c.key for c in calls])
    if tripped is None:
        return
    key, count = tripped
    threshold = parts.limits.loop_threshold
    raise ToolLoopDetected(
        f"the model requested the identical call {key[:120]} a {_ordinal(count)} time, "
        f"reaching the limit of {threshold}; the batch of {len(calls)} call(s) was not run",
        step=parts.state.step,
        details={"call_key": key, "count": count, "threshold": threshold},
    )


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
