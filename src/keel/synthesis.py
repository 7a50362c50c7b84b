"""When the next turn must be synthesis-only, and the volatile control that says why.

Two reasons exist. Repeated-tool synthesis (ADR-0136): some call key stands at threshold-1, so
one more identical request would trip the hard breaker; the model gets one turn, without tools,
to write the best supported answer. Budget synthesis: the budget allows one more model call, or
no more tool calls, or too few tokens for more than this turn. When both hold, one synthesis turn
is sent with both controls, and it is classified as budget synthesis.

Controls are platform text for one request only. They never quote tool arguments or retrieved
text, and they never enter the store or the frozen prefix.
"""

from __future__ import annotations

from dataclasses import dataclass

from keel.messages import SynthesisReason

__all__ = [
    "BUDGET_CONTROL",
    "NORMAL",
    "REPEATED_TOOL_CONTROL",
    "Mode",
    "decide_mode",
]

REPEATED_TOOL_CONTROL = (
    "Research has stopped because it was repeating the same tool request, so no tools are "
    "available for this reply. Write the best answer the evidence already gathered supports. "
    "Name the gaps that remain open, say plainly that research stopped because it was "
    "repeating, and do not claim that unfinished work is complete."
)

BUDGET_CONTROL = (
    "This run's budget is nearly spent, so this is the last reply and no tools are available "
    "for it. Write the best answer the evidence already gathered supports. Name the gaps that "
    "remain open, say that research stopped at the budget, and do not claim that unfinished "
    "work is complete."
)


@dataclass(frozen=True, slots=True)
class Mode:
    """How the next turn is sent. `reason` None is a normal turn with tools."""

    reason: SynthesisReason | None = None
    controls: tuple[str, ...] = ()
    repeated_key: str | None = None
    """The key at threshold-1, when repetition is (part of) the reason."""
    budget: str | None = None
    """Which budget is running out, when the budget is (part of) the reason."""


NORMAL = Mode()


def decide_mode(repeated_key: str | None, budget: str | None) -> Mode:
    if budget is not None:
        controls = (BUDGET_CONTROL, REPEATED_TOOL_CONTROL) if repeated_key else (BUDGET_CONTROL,)
        return Mode("budget", controls, repeated_key, budget)
    if repeated_key is not None:
        return Mode("repeated_tool", (REPEATED_TOOL_CONTROL,), repeated_key, None)
    return NORMAL
