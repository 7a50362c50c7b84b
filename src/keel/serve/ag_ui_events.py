"""A Keel run's record, as AG-UI events (ADR 0041): pure mapping, no I/O.

`EventMapper` turns what `agent.stream()` yields (the record's events and the text deltas, ADR
0024 and 0039) into the protocol's events, in order; `messages_snapshot`, `state_snapshot`
and `ending` read a stored run for what is sent before the terminal event. The ids it gives
are derived from the record alone, so a resumed run (in another process, after a restart)
names the same messages and calls the same way:

- a tool call: ``<keel run id>:<keel call id>`` (unique in a thread of several runs), which is
  also the id of the interrupt that asks to approve it; a sub-agent's call, as its parent shows
  it, is ``<parent run>:<child run>:<call id>`` (ADR 0046), so the run is what precedes the
  first colon (a Keel run id has none) and the rest is the call, however deep the tree;
- the assistant message of a model turn: ``<run>:s<step>a<attempt>``;
- the tool message of a result: ``<run>:<call id>:result``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from ag_ui.core import (
    AssistantMessage,
    BaseEvent,
    CustomEvent,
    FunctionCall,
    Interrupt,
    Message,
    RunErrorEvent,
    RunFinishedCancelledOutcome,
    RunFinishedEvent,
    RunFinishedInterruptOutcome,
    RunFinishedSuccessOutcome,
    StepFinishedEvent,
    StepStartedEvent,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    ToolCall,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
    ToolMessage,
    UserMessage,
)

from keel.events import ChildEvent, event_json
from keel.messages import SynthesisReason
from keel.records import (
    Event,
    ModelRequestSent,
    ModelResponseReceived,
    RunCompleted,
    RunResumed,
    RunStarted,
    ToolCallRequested,
    ToolResultRecorded,
)
from keel.result import PendingApproval, RunResult
from keel.store import RunRecord
from keel.transports.streaming import TextDelta, TextDiscarded, TextEvent

__all__ = [
    "APPROVAL_SCHEMA",
    "INTERRUPT_REASON",
    "SYNTHESIS_WHY",
    "EventMapper",
    "call_id_of",
    "ending",
    "interrupt_id",
    "messages_snapshot",
    "state_snapshot",
]

INTERRUPT_REASON = "tool_approval"
"""The `reason` of every interrupt Keel sends: a tool call waits for a person's decision."""

APPROVAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "approved": {"type": "boolean"},
        "reason": {"type": "string", "description": "Why (a denial's reason, told the model)."},
        "arguments": {
            "type": "object",
            "description": "Approve with these arguments instead (the whole arguments object).",
        },
        "for_run": {
            "type": "boolean",
            "description": "Also approve every later call of this tool in the run.",
        },
        "answer": {
            "type": "string",
            "description": "Answer in place of the tool: this text is the call's result.",
        },
    },
    "required": ["approved"],
    "additionalProperties": False,
}
"""What a resume entry's payload must be (`Interrupt.response_schema`)."""

SYNTHESIS_WHY: dict[SynthesisReason, str] = {
    SynthesisReason.REPEATED_TOOL: "the run kept repeating an identical tool call, so it "
    "answers now from the evidence it has",
    SynthesisReason.BUDGET: "a budget of the run is nearly spent, so it answers now from the "
    "evidence it has",
    SynthesisReason.DEADLINE: "the run's deadline is near, so it answers now from the evidence "
    "it has",
    SynthesisReason.CONTEXT: "the next request would not fit the model's context window, so it "
    "answers now from what fits",
}
"""What the `keel.synthesis` custom event says, per reason (ADR 0002, 0033)."""


def interrupt_id(run_id: str, call_id: str) -> str:
    """A tool call's AG-UI id, and its approval interrupt's: the Keel run and call ids."""
    return f"{run_id}:{call_id}"


def call_id_of(interrupt: str) -> tuple[str, str] | None:
    """(run id, call id) named by an interrupt id; None when it is not one Keel gave. The run
    is the part before the first colon: a child's call id (``CHILD:CALL``) keeps its own."""
    run_id, colon, call_id = interrupt.partition(":")
    if not colon or not run_id or not call_id:
        return None
    return run_id, call_id


def _message_id(run_id: str, step: int, attempt: int) -> str:
    return f"{run_id}:s{step}a{attempt}"


def _result_id(run_id: str, call_id: str) -> str:
    return f"{run_id}:{call_id}:result"


def _ms(at: float) -> int | None:
    return int(at * 1000) if at > 0 else None


def _custom(name: str, value: Any, at: float = 0.0) -> CustomEvent:
    return CustomEvent(name=name, value=value, timestamp=_ms(at))


class EventMapper:
    """One Keel run's stream as AG-UI events. Each model turn is a step (`step_<n>`; a
    synthesis-only turn's step is `synthesis:<reason>`, announced by a `keel.synthesis` custom
    event); record events without a protocol counterpart go out as `keel.<type>` custom
    events carrying the event as `keel show --json` prints it."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self._step: tuple[int, str] | None = None
        """The open step: its number and name."""
        self._attempt: dict[int, int] = {}
        """Each step's current attempt, as its last `ModelRequestSent` numbered it."""
        self._open_text: str | None = None
        self._sent_text: set[str] = set()
        """Messages whose text went out as deltas (and so are not sent again whole)."""

    def feed(self, event: Event | TextEvent | ChildEvent) -> list[BaseEvent]:
        """The AG-UI events for one item of the Keel stream."""
        if isinstance(event, TextDelta):
            return self._delta(event)
        if isinstance(event, TextDiscarded):
            return self._discarded(event)
        if isinstance(event, ChildEvent):  # a child run's (sub-agents): its own, told as such
            return [_custom("keel.child_event", event.to_json(), event.event.at)]
        out = self._enter(event)
        match event:
            case ModelRequestSent():
                self._attempt[event.step] = event.attempt
                if event.synthesis is not None:
                    reason = SynthesisReason(event.synthesis)
                    value = {"reason": reason.value, "step": event.step}
                    value["why"] = SYNTHESIS_WHY[reason]
                    out.append(_custom("keel.synthesis", value, event.at))
            case ModelResponseReceived():
                out += self._response(event)
            case ToolResultRecorded():
                out.append(
                    ToolCallResultEvent(
                        message_id=_result_id(self.run_id, event.call_id),
                        tool_call_id=interrupt_id(self.run_id, event.call_id),
                        content=event.content,
                        role="tool",
                        timestamp=_ms(event.at),
                    )
                )
            case RunStarted() | RunResumed() | ToolCallRequested() | RunCompleted():
                pass  # said otherwise: `keel.run`, the response's calls, RUN_FINISHED
            case _:
                shown = event_json(event)
                out.append(_custom(f"keel.{shown['type']}", shown, event.at))
        return out

    def close(self) -> list[BaseEvent]:
        """End what is open (a text message, the step): before the terminal event."""
        out = self._end_text()
        if self._step is not None:
            out.append(StepFinishedEvent(step_name=self._step[1]))
            self._step = None
        return out

    def _enter(self, event: Event) -> list[BaseEvent]:
        """Open the event's step when it is not the open one (closing that one first)."""
        if event.step <= 0 or (self._step is not None and self._step[0] == event.step):
            return []
        out = self.close()
        name = f"step_{event.step}"
        if isinstance(event, ModelRequestSent) and event.synthesis is not None:
            name = f"synthesis:{event.synthesis}"
        self._step = (event.step, name)
        out.append(StepStartedEvent(step_name=name, timestamp=_ms(event.at)))
        return out

    def _delta(self, delta: TextDelta) -> list[BaseEvent]:
        message = _message_id(self.run_id, delta.step, delta.attempt)
        out: list[BaseEvent] = []
        if self._open_text != message:
            out += self._end_text()
            out.append(TextMessageStartEvent(message_id=message, role="assistant"))
            self._open_text = message
            self._sent_text.add(message)
        out.append(TextMessageContentEvent(message_id=message, delta=delta.text))
        return out

    def _discarded(self, marker: TextDiscarded) -> list[BaseEvent]:
        message = _message_id(self.run_id, marker.step, marker.attempt)
        out = self._end_text() if self._open_text == message else []
        value = {"message_id": message, "step": marker.step, "attempt": marker.attempt}
        out.append(_custom("keel.text_discarded", value))
        return out

    def _end_text(self) -> list[BaseEvent]:
        if self._open_text is None:
            return []
        message, self._open_text = self._open_text, None
        return [TextMessageEndEvent(message_id=message)]

    def _response(self, event: ModelResponseReceived) -> list[BaseEvent]:
        message = _message_id(self.run_id, event.step, self._attempt.get(event.step, 1))
        at = _ms(event.at)
        out: list[BaseEvent] = []
        if self._open_text == message:
            out += self._end_text()
        elif event.text and message not in self._sent_text:  # not streamed: sent whole
            out.append(TextMessageStartEvent(message_id=message, role="assistant", timestamp=at))
            out.append(TextMessageContentEvent(message_id=message, delta=event.text))
            out.append(TextMessageEndEvent(message_id=message))
        for call in event.tool_calls:
            call_id = interrupt_id(self.run_id, call.id)
            out.append(
                ToolCallStartEvent(
                    tool_call_id=call_id,
                    tool_call_name=call.name,
                    parent_message_id=message,
                    timestamp=at,
                )
            )
            out.append(ToolCallArgsEvent(tool_call_id=call_id, delta=call.arguments))
            out.append(ToolCallEndEvent(tool_call_id=call_id))
        return out


def messages_snapshot(
    run_id: str, question: str, events: Iterable[Event], given: Sequence[Message]
) -> list[Message]:
    """The thread's messages for MESSAGES_SNAPSHOT: the client's own (`given`, less any this
    run made, which the record replaces), then the run's turns and results as recorded. A
    streamed attempt that failed is not among them: its text was discarded."""
    own = f"{run_id}:"
    kept = [m for m in given if not m.id.startswith(own)]
    if not any(m.role == "user" for m in kept):
        kept.append(UserMessage(id=f"{run_id}:question", content=question))
    attempt: dict[int, int] = {}
    for event in events:
        if isinstance(event, ModelRequestSent):
            attempt[event.step] = event.attempt
        elif isinstance(event, ModelResponseReceived):
            calls = [
                ToolCall(
                    id=interrupt_id(run_id, c.id),
                    function=FunctionCall(name=c.name, arguments=c.arguments),
                )
                for c in event.tool_calls
            ]
            kept.append(
                AssistantMessage(
                    id=_message_id(run_id, event.step, attempt.get(event.step, 1)),
                    content=event.text or None,
                    tool_calls=calls or None,
                )
            )
        elif isinstance(event, ToolResultRecorded):
            kept.append(
                ToolMessage(
                    id=_result_id(run_id, event.call_id),
                    tool_call_id=interrupt_id(run_id, event.call_id),
                    content=event.content,
                    error=event.content if event.is_error else None,
                )
            )
    return kept


def _pending_json(run_id: str, pending: PendingApproval) -> dict[str, Any]:
    shown: dict[str, Any] = {
        "interrupt_id": interrupt_id(run_id, pending.call_id),
        "call_id": pending.call_id,
        "name": pending.name,
        "arguments": pending.arguments,
    }
    if pending.note:
        shown["note"] = pending.note
    return shown


def state_snapshot(record: RunRecord) -> dict[str, Any]:
    """STATE_SNAPSHOT's state: where the Keel run stands, as its stored state says."""
    state = record.state
    decided = state.decisions
    return {
        "keel": {
            "run_id": record.run_id,
            "status": record.status,
            "step": state.step,
            "model_calls": state.model_calls,
            "tool_calls": state.tool_calls,
            "synthesized": state.synthesized,
            "pending_approvals": [
                _pending_json(record.run_id, p) for p in state.pending if p.call_id not in decided
            ],
        }
    }


def _interrupt(run_id: str, pending: PendingApproval) -> Interrupt:
    arguments = json.dumps(pending.arguments, ensure_ascii=False)
    message = f"Approve {pending.name}({arguments})?"
    if pending.note:
        message += f" Note: {pending.note}"
    return Interrupt(
        id=interrupt_id(run_id, pending.call_id),
        reason=INTERRUPT_REASON,
        message=message,
        tool_call_id=interrupt_id(run_id, pending.call_id),
        response_schema=APPROVAL_SCHEMA,
        metadata={"keel": _pending_json(run_id, pending)},
    )


def ending(thread_id: str, run_id: str, result: RunResult) -> BaseEvent:
    """The terminal event for a run's result: RUN_FINISHED (success, interrupt or cancelled,
    `result` the `keel run --json` object) or RUN_ERROR with the classified failure kind."""
    shown = result.to_dict()
    if result.status == "completed":
        outcome: Any = RunFinishedSuccessOutcome()
    elif result.status == "awaiting_approval" and result.pending_approvals:
        interrupts = [_interrupt(result.run_id, p) for p in result.pending_approvals]
        outcome = RunFinishedInterruptOutcome(interrupts=interrupts)
    elif result.status == "cancelled":
        outcome = RunFinishedCancelledOutcome()
    elif result.failure is not None:
        return RunErrorEvent(message=result.failure.message, code=result.failure.kind)
    elif result.status == "awaiting_children":  # its children run on the workers (ADR 0069)
        return RunErrorEvent(
            message=f"run {result.run_id} waits for its child runs, which keel workers run; "
            "the last of them to end queues it again",
            code="NotEnded",
        )
    else:  # stopped before it ended (`running`): nothing to answer, resumable
        return RunErrorEvent(
            message=f"run {result.run_id} stopped before it ended ({result.status}); "
            f"`keel resume {result.run_id}` continues it",
            code="NotEnded",
        )
    return RunFinishedEvent(thread_id=thread_id, run_id=run_id, result=shown, outcome=outcome)
