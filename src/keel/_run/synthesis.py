"""The mode of the next turn: synthesis-only (and the volatile control that says why), a turn
that insists on a tool call, or a normal one.

Four reasons for synthesis exist. Repeated-tool synthesis (docs/adr/0002): some call key stands
at threshold-1, so one more identical request would trip the hard breaker; the model gets one
turn, without tools, to write the best supported answer. Budget synthesis: the budget allows one
more model call, or no more tool calls, or too few tokens for more than this turn. Deadline
synthesis (ADR 0033): less time is left before the run's deadline than one more turn is
estimated to take. Context synthesis (issue 44): the next request would not fit the model's
window even with older results elided and the latest batch clamped (`context_mode`, decided
after the request is built). When several hold, one synthesis turn is sent with all their
controls, and it is classified by the hardest limit: the deadline, then the budget, then
repetition; context synthesis only where no other reason holds.

A run may insist on evidence first (`Limits.first_turn_tool`, ``keel run --first-turn-tool``):
its first turn is sent with tool_choice "required", so the model calls a tool before it may
answer. Only the first turn, only when the run has tools, and never over synthesis: a turn that
must be synthesis-only stays synthesis-only (ADR 0027).

Controls are platform text for one request only. They never quote tool arguments or retrieved
text, and they never enter the store or the frozen prefix. They are worded so that nothing in
them is worth repeating: imperatives about the answer, never a statement the answer could echo.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from keel.messages import SynthesisReason, ToolChoice

__all__ = [
    "BUDGET_CONTROL",
    "CONTEXT_CONTROL",
    "CONTROLS",
    "DEADLINE_CONTROL",
    "FIRST_CALL_CONTROL",
    "NORMAL",
    "NUDGE_PREFIX",
    "PARTIAL_OUTPUT_CONTROL",
    "REPEATED_TOOL_CONTROL",
    "TOOL_REQUIRED",
    "Mode",
    "context_mode",
    "decide_mode",
    "first_call_control",
    "nudge_control",
    "question_control",
    "with_question",
]

CITING = (
    "citing each result you use by the id it begins with, in brackets, and putting any quote in "
    "double quotation marks followed by that id"
)
"""How a synthesis answer cites (ADR 0053), inside the controls' first sentence: a sentence of
its own would be one more a small model could echo."""

REPEATED_TOOL_CONTROL = (
    f"Answer the question now, from the tool results above and nothing else, {CITING}: first "
    "the answer, then one sentence on what they do not show. Do not call a tool again."
)
"""Imperatives only, about the answer (ADR 0036): no sentence about Keel's own state ("research
stopped because it was repeating...") and none asking the model to say one, which a small
model copied into its answers. The result's `synthesized` field says why the turn came. "Name
what they leave unknown" became "first the answer, then one sentence on what they do not
show" (ADR 0043): the 0.5B model answered it with a list of invented unknowns instead of the
answer; with the new wording it listed 21 modules for the README question, 18 of them right."""

BUDGET_CONTROL = (
    "Answer the question now, in this last reply, from the tool results above and nothing "
    f"else, {CITING}: first the answer, then one sentence on what they do not show."
)

DEADLINE_CONTROL = (
    "This run's time is nearly up: its deadline leaves room for this reply only, so no tools "
    "are available for it. Write the best answer the evidence already gathered supports, "
    f"{CITING}. Name "
    "the gaps that remain open, say that research stopped because time ran out, and do not "
    "claim that unfinished work is complete."
)

CONTEXT_CONTROL = (
    "Answer the question now, in this reply, from the tool results above and nothing else, "
    f"{CITING}: first the answer, then one sentence on what they do not show."
)
"""A context synthesis turn (issue 44): the next request would not fit the model's window.
Imperatives only, like the others; what was left out is in the pointers above."""

PARTIAL_OUTPUT_CONTROL = (
    'Reply with one JSON object and nothing else: under "output", the answer in the required '
    'schema, filled in as far as the evidence supports it; under "gaps", a list of what '
    "remains open."
)
"""Added to a synthesis turn's controls when the run asked for structured output (ADR 0034)."""

MAX_RESTATED_QUESTION_CHARS = 1000
"""A longer question is not restated: the history above holds it, and a pasted document would
double the synthesis request."""


def question_control(question: str) -> str | None:
    """The run's question, restated right before a synthesis turn's control (ADR 0043): asked
    to answer "the question" at the end of a long context, the 0.5B model answered one about
    the tool it had called ("depends on the search_files function"); with the question
    restated, it listed loop.py's imports. None for an empty or overlong question."""
    text = " ".join(question.split())
    if not text or len(text) > MAX_RESTATED_QUESTION_CHARS:
        return None
    return f"The question to answer: {text}"


def with_question(mode: Mode, question: str) -> Mode:
    """`mode` with the question restated first among its controls, if it is a synthesis turn."""
    restated = question_control(question) if mode.reason is not None else None
    if restated is None:
        return mode
    return dataclasses.replace(mode, controls=(restated, *mode.controls))


NUDGE_PREFIX = "Note: "


def nudge_control(tools: str) -> str:
    """The nudge (docs/adr/0050): one normal turn's volatile note at the first repeat (T-2),
    tools still offered. It names the tool and says the result was the same; no arguments and
    no retrieved text, as for every control."""
    return (
        f"{NUDGE_PREFIX}{tools} just gave the same result again. Do not repeat it: try a "
        "different approach, or answer from the evidence you have."
    )


CONTROLS = (
    REPEATED_TOOL_CONTROL,
    BUDGET_CONTROL,
    DEADLINE_CONTROL,
    CONTEXT_CONTROL,
    PARTIAL_OUTPUT_CONTROL,
)
"""Every control a synthesis turn may carry: what an answer must never repeat (`keel eval`
checks each answer against them)."""


FIRST_CALL_CONTROL = (
    "Start with the tool that reads what the question names: a file by its path exactly as "
    "the question writes it, or a name by searching for it."
)
"""Sent with a first turn that must call a tool (issue 25): the local model's first call went
to list_files with a path it made up ("/path/to/repository", four times; "/keel/_run/loop.py"
for src/keel/_run/loop.py) instead of reading the file the question named."""


def first_call_control(call: str | None) -> str:
    """The first turn's control, naming the call to start with when there is one."""
    if call is None:
        return FIRST_CALL_CONTROL
    return f"{FIRST_CALL_CONTROL} Here that is: {call}"


@dataclass(frozen=True, slots=True)
class Mode:
    """How the next turn is sent. `reason` None is a normal turn with tools."""

    reason: SynthesisReason | None = None
    controls: tuple[str, ...] = ()
    repeated_key: str | None = None
    """The key at threshold-1, when repetition is (part of) the reason."""
    budget: str | None = None
    """Which budget is running out, when the budget is (part of) the reason."""
    tool_required: bool = False
    """A normal turn that must call a tool (the run's first turn, with `first_turn_tool`)."""

    @property
    def tool_choice(self) -> ToolChoice:
        """What the request says: "none" in synthesis, "required" when insisting, else None."""
        if self.reason is not None:
            return "none"
        return "required" if self.tool_required else None


NORMAL = Mode()


def context_mode(mode: Mode, question: str) -> Mode:
    """A turn that must answer because its request does not fit the window: a synthesis turn
    already keeps its reason (and gets the context control too), a normal one becomes one."""
    if mode.reason is not None:
        if CONTEXT_CONTROL in mode.controls:
            return mode
        return dataclasses.replace(mode, controls=(*mode.controls, CONTEXT_CONTROL))
    return with_question(Mode(SynthesisReason.CONTEXT, (CONTEXT_CONTROL,)), question)


TOOL_REQUIRED = Mode(controls=(FIRST_CALL_CONTROL,), tool_required=True)


def decide_mode(
    repeated_key: str | None,
    budget: str | None,
    *,
    insist_on_tool: bool = False,
    out_of_time: bool = False,
    first_call: str | None = None,
) -> Mode:
    """Synthesis first (the deadline over the budget over repetition), then a required tool
    call, then normal.

    `insist_on_tool`: the run wants evidence before an answer on this turn (its first turn,
    with tools offered); it never turns a synthesis turn back into one that calls tools.
    `first_call`: the call its control names (`keel.transports.base.SteersFirstCall`).
    `out_of_time`: the time left is below the deadline reserve."""
    if out_of_time:
        controls: tuple[str, ...] = (DEADLINE_CONTROL,)
        if budget is not None:
            controls += (BUDGET_CONTROL,)
        if repeated_key is not None:
            controls += (REPEATED_TOOL_CONTROL,)
        return Mode(SynthesisReason.DEADLINE, controls, repeated_key, budget)
    if budget is not None:
        controls = (BUDGET_CONTROL, REPEATED_TOOL_CONTROL) if repeated_key else (BUDGET_CONTROL,)
        return Mode(SynthesisReason.BUDGET, controls, repeated_key, budget)
    if repeated_key is not None:
        return Mode(SynthesisReason.REPEATED_TOOL, (REPEATED_TOOL_CONTROL,), repeated_key, None)
    if not insist_on_tool:
        return NORMAL
    if first_call is None:
        return TOOL_REQUIRED
    return Mode(controls=(first_call_control(first_call),), tool_required=True)
