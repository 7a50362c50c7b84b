"""The run's limits as questions a step asks: may it go on, and is the budget running out?

Step 1 of the loop stops a run that is past its deadline or out of budget; step 2 makes the
next turn budget synthesis when one model call is left, the tool calls are spent, the tokens
left would not pay for more than this turn, or the next call could pass the cost limit, and
deadline synthesis when the time left is below the deadline reserve (ADR 0033). Both are asked
again before every model attempt.

The next call is priced from its own request (`next_call_cost`): its input tokens, counted
before it is sent, all at the full input price, plus its output limit at the output price. A
transport that declares no output limit leaves the output unknown, so then the estimate is at
least the run's costliest call so far. Each result makes the next request longer, so the
costliest call so far alone underprices it (a $0.02 limit ended at $0.0436, issue 37); priced
from its request, a run ends within its limit plus the synthesis turn's own cost.

The deadline reserve is the time one synthesis turn is expected to take:
`Limits.deadline_reserve` when given, else DEADLINE_RESERVE_FACTOR times the run's longest
model call so far, at least DEADLINE_RESERVE_FLOOR seconds. A synthesis turn carries the whole
history, so it is at least as slow as the turns before it; twice the slowest leaves room for a
longer answer. Before the run has timed a model call there is no estimate and no reserve: the
first turn goes out normally.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from keel.errors import BudgetExhausted, DeadlineExceeded, RunFailure
from keel.limits import Limits
from keel.pricing import MILLION, Price
from keel.records import RunState

__all__ = [
    "DEADLINE_RESERVE_FACTOR",
    "DEADLINE_RESERVE_FLOOR",
    "Clock",
    "deadline_reserve",
    "next_call_cost",
    "out_of_time",
    "output_limit",
    "past_limits",
    "running_out",
    "synthesis_after",
]

DEADLINE_RESERVE_FLOOR = 1.0
"""The least reserve estimated from a run's timings, in seconds: room for the request to be
built and sent, and for a model that was fast so far to be slower once."""
DEADLINE_RESERVE_FACTOR = 2.0
"""The estimated reserve is this many times the run's longest model call."""


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
    cost = limits.max_cost
    if cost is not None and (state.cost or 0.0) >= cost:
        spent = state.cost or 0.0
        return BudgetExhausted(
            f"the cost budget of ${cost:g} was spent (${spent:.4f} used) before an answer",
            step=state.step,
            details={"budget": "cost", "limit": cost, "cost": spent},
        )
    tokens = limits.max_tokens
    if tokens is not None and state.usage.total >= tokens:
        return BudgetExhausted(
            f"the token budget of {tokens} was spent ({state.usage.total} used) before an answer",
            step=state.step,
            details={"budget": "tokens", "limit": tokens},
        )
    return None


def running_out(
    state: RunState,
    limits: Limits,
    context_tokens: int,
    next_cost: float | None = None,
    *,
    after: float | None = None,
) -> str | None:
    """The budget that allows only a final answer now, if any. `next_cost`: what the next
    call is expected to cost (`next_call_cost`); None: as much as the costliest so far.
    `after`: what the synthesis turn after the next call is expected to cost, when it must
    fit in the cost limit too (a child run: its limit is a share its parent reserved, and the
    tree may pass the parent's limit by one call only, the parent's own; SA-02)."""
    if limits.max_model_calls is not None and limits.max_model_calls - state.model_calls <= 1:
        return "model_calls"
    if limits.max_tool_calls is not None and state.tool_calls >= limits.max_tool_calls:
        return "tool_calls"
    if limits.max_tokens is not None and limits.max_tokens - state.usage.total < 2 * context_tokens:
        return "tokens"
    estimate = state.costliest_call if next_cost is None else next_cost
    estimate += after or 0.0  # this turn, and the synthesis after it
    if limits.max_cost is not None and (state.cost or 0.0) + estimate > limits.max_cost:
        return "cost"  # the next call could pass it
    return None


def next_call_cost(
    state: RunState, price: Price | None, input_tokens: int, output_tokens: int | None
) -> float | None:
    """Dollars the next call may cost: `input_tokens` (its request, counted before sending)
    at the full input price and `output_tokens` (its output limit) at the output price; with
    no output limit, at least the run's costliest call so far. None without a price."""
    if price is None:
        return None
    cost = input_tokens * price.input / MILLION
    if output_tokens is None:
        return max(cost, state.costliest_call)
    return cost + output_tokens * price.output / MILLION


def output_limit(transport: object) -> int | None:
    """The most output tokens a transport asks for per call (`max_tokens`, or the Responses
    API's `max_output_tokens`), when it declares one."""
    for name in ("max_tokens", "max_output_tokens"):
        value = getattr(transport, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def deadline_reserve(state: RunState, limits: Limits) -> float | None:
    """Seconds to keep for one synthesis turn; None when there is nothing to estimate from."""
    if limits.deadline_reserve is not None:
        return limits.deadline_reserve
    if state.longest_model_call <= 0:
        return None
    return max(DEADLINE_RESERVE_FLOOR, DEADLINE_RESERVE_FACTOR * state.longest_model_call)


def out_of_time(state: RunState, limits: Limits, clock: Clock) -> bool:
    """Less time is left than the synthesis turn needs: the next turn must be the last."""
    remaining = clock.remaining()
    if remaining is None:
        return False
    reserve = deadline_reserve(state, limits)
    return reserve is not None and remaining < reserve


def synthesis_after(
    state: RunState, price: Price | None, input_tokens: int, output_tokens: int | None
) -> float | None:
    """What a synthesis turn after the next call may cost: the next request grown by as much
    as the last turn grew it (its results), priced as `next_call_cost` prices a call."""
    grown = input_tokens + max(0, input_tokens - state.last_request_tokens)
    return next_call_cost(state, price, grown, output_tokens)
