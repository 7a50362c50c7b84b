"""The run's limits as questions a step asks: may it go on, and is the budget running out?

Step 1 of the loop stops a run that is past its deadline or out of budget; step 2 makes the
next turn budget synthesis when one model call is left, the tool calls are spent, or the tokens
left would not pay for more than this turn. Both are asked again before every model attempt.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from keel.errors import BudgetExhausted, DeadlineExceeded, RunFailure
from keel.limits import Limits
from keel.records import RunState

__all__ = ["Clock", "past_limits", "running_out"]


@dataclass(slots=True)
class Clock:
    """The run's wall-clock deadline, absolute, so it survives a resume in another process."""

    deadline_at: float | None = None
    """Unix time the run must end by; None for no deadline."""

    def remaining(self) -> float | None:
        if self.deadline_at is None:
            return None
        return max(0.0, self.deadline_at - time.time())

    def passed(self) -> bool:
        return self.deadline_at is not None and time.time() >= self.deadline_at

    def loop_deadline(self) -> float | None:
        """The deadline on the event loop's clock, for timeouts of in-flight calls."""
        remaining = self.remaining()
        return None if remaining is None else asyncio.get_running_loop().time() + remaining


def past_limits(state: RunState, limits: Limits, clock: Clock) -> RunFailure | None:
    """Why the run may not take another model turn, if it may not."""
    if clock.passed():
        return DeadlineExceeded(
            f"the run passed its deadline of {limits.deadline:g}s",
            step=state.step,
            details={"deadline": limits.deadline},
        )
    calls = limits.max_model_calls
    if calls is not None and state.model_calls >= calls:
        return BudgetExhausted(
            f"all {calls} model calls of the budget were spent before an answer",
            step=state.step,
            details={"budget": "model_calls", "limit": calls},
        )
    tokens = limits.max_tokens
    if tokens is not None and state.usage.total >= tokens:
        return BudgetExhausted(
            f"the token budget of {tokens} was spent ({state.usage.total} used) before an answer",
            step=state.step,
            details={"budget": "tokens", "limit": tokens},
        )
    return None


def running_out(state: RunState, limits: Limits, context_tokens: int) -> str | None:
    """The budget that allows only a final answer now, if any."""
    if limits.max_model_calls is not None and limits.max_model_calls - state.model_calls <= 1:
        return "model_calls"
    if limits.max_tool_calls is not None and state.tool_calls >= limits.max_tool_calls:
        return "tool_calls"
    if limits.max_tokens is not None and limits.max_tokens - state.usage.total < 2 * context_tokens:
        return "tokens"
    return None
