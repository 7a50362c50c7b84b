"""Where a stored run stands: its state, counters, elisions, history and any unanswered batch.

The history is rebuilt from the event log exactly as the context builder first saw it (results
in request order, elided results as pointers), so the next request is what it would have been
had the process not stopped. Calls keep the ids recorded with them: Keel's own (`k<step>_<n>`),
with the provider's beside them for the wire, or, in runs recorded before Keel gave its own,
the provider's, which those runs' results, decisions and journal entries name them by (ADR
0030). So the open batch's results, decisions and journal entries find their calls again.
"""

from __future__ import annotations

from dataclasses import dataclass

from keel._run.batch import Batch
from keel.errors import ConfigError
from keel.messages import AssistantMessage, Item, ToolCall, ToolResult, UserMessage
from keel.records import (
    Event,
    EvidenceRejected,
    KeyCounter,
    ModelResponseReceived,
    OutputRejected,
    RunStarted,
    RunState,
    ToolDispatched,
    ToolResultRecorded,
)
from keel.result import OVER
from keel.store import RunRecord, RunStore

__all__ = ["ResumePoint", "load", "rebuild_items"]


@dataclass(frozen=True, slots=True)
class ResumePoint:
    record: RunRecord
    state: RunState
    counters: dict[str, KeyCounter]
    elided: set[str]
    history: list[Item]
    batch: Batch | None
    """The last batch, when some of its calls have no result yet."""


def load(store: RunStore, run_id: str) -> ResumePoint:
    record = store.get_run(run_id)
    if record is None:
        raise ConfigError(f"no run {run_id} in {store.path}")
    if record.status in OVER:  # a cancelled one resumes (ADR 0036)
        raise ConfigError(f"run {run_id} has already ended ({record.status}); nothing to resume")
    events = store.events(run_id)
    state = record.state
    state.next_seq = max(state.next_seq, events[-1].seq + 1 if events else 0)
    history, batch = _history(events)
    return ResumePoint(record, state, store.counters(run_id), store.elided(run_id), history, batch)


def _history(events: list[Event]) -> tuple[list[Item], Batch | None]:
    items: list[Item] = []
    batch: Batch | None = None
    dispatched: set[str] = set()

    def close_batch() -> None:
        for call in batch.calls if batch else ():
            if call.id in batch.answered:  # type: ignore[union-attr]
                items.append(batch.answered[call.id])  # type: ignore[union-attr]

    for event in events:
        if isinstance(event, RunStarted):
            items.append(UserMessage(event.question))
        elif isinstance(event, ModelResponseReceived) and event.tool_calls:
            close_batch()
            calls = [
                ToolCall.from_raw(c.id, c.name, c.arguments, provider_id=c.provider_id)
                for c in event.tool_calls
            ]
            items.append(AssistantMessage(event.text, tuple(calls), event.provider_details))
            batch = Batch(calls)
        elif isinstance(event, OutputRejected):  # an answer that did not validate, and why
            close_batch()
            batch = None
            items.append(AssistantMessage(event.text))
            items.append(UserMessage(event.feedback))
        elif isinstance(event, EvidenceRejected):  # an answer sent back once (ADR 0053)
            close_batch()
            batch = None
            items.append(AssistantMessage(event.text))
        elif isinstance(event, ToolDispatched):
            dispatched.add(event.call_id)
        elif isinstance(event, ToolResultRecorded) and batch is not None:
            batch.answered[event.call_id] = _result(event)
    if batch is None or not batch.open_calls():
        close_batch()
        return items, None
    # The open batch's results are appended, in request order, when it is answered.
    batch.journaled = {c.id for c in batch.open_calls() if c.id in dispatched}
    return items, batch


def rebuild_items(events: list[Event]) -> tuple[list[Item], Batch | None]:
    """A run's history from its events, as its context first saw it, and any open batch;
    a follow-up's history (`history.py`) is built from its earlier runs' the same way."""
    return _history(events)


def _result(event: ToolResultRecorded) -> ToolResult:
    return ToolResult(
        call_id=event.call_id,
        name=event.name,
        call_key=event.call_key,
        content=event.content,
        is_error=event.is_error,
        size=event.size,
        digest=event.digest,
        truncated=event.truncated,
        uncertain=event.uncertain,
    )
