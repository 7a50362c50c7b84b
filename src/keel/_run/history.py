"""A conversation's history: what a follow-up question continues (ADR 0038).

A follow-up is a run of its own (id, status, limits, counters) whose context starts with the
earlier runs' recorded items: each run's history as `resume` rebuilds it from the event log
(results in request order, elided ones as pointers, the elisions already decided kept), then
its answer, then the next run's. Built from the store alone, so any process can ask.

Keel's call ids (`k3_0`) are unique within a run only, and two runs of one conversation both
have a `k1_0`. In the history, an earlier run's calls and results are named `<run id>/<call id>`
(the same in every process, so the elisions a follow-up records by that name find their item
again), and each call keeps, as its provider id, the id the earlier run sent for it on the wire:
so the bytes that run sent are the bytes the follow-up repeats (the prompt cache still hits).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from keel._run.resume import ResumePoint, rebuild_items
from keel.errors import ConfigError
from keel.messages import AssistantMessage, Item, ToolCall, ToolResult, digest_text, wire_call_ids
from keel.records import Event, ModelResponseReceived, RunCompleted
from keel.result import OVER
from keel.store import RunRecord, RunStore

__all__ = ["Continuation", "continuation", "latest_run", "prefix", "resumed"]


@dataclass(frozen=True, slots=True)
class Continuation:
    """What a follow-up starts from."""

    conversation_id: str | None
    """None: the follow-up begins a conversation of its own (a fork)."""
    continues_from: str
    history: list[Item]
    elided: set[str]


def continuation(store: RunStore, run_id: str, *, fork: bool = False) -> Continuation:
    """The history a new question on `run_id` continues. Refuses a run that has not ended
    (resume it first) and, unless `fork`, a run the conversation has already gone on from."""
    record = store.get_run(run_id)
    if record is None:
        raise ConfigError(f"no run {run_id} in {store.path}")
    if record.status not in OVER:
        raise ConfigError(_not_ended(record))
    if not fork:
        latest = store.conversation(record.conversation_id)[-1:]
        if latest and latest[0].run_id != run_id:
            raise ConfigError(
                f"run {run_id} already has a follow-up: the conversation "
                f"{record.conversation_id} goes on at {latest[0].run_id}; ask that run, or fork "
                f"from this one (keel ask --fork {run_id} ...)"
            )
    history, elided = prefix(store, record, own=True)
    return Continuation(None if fork else record.conversation_id, run_id, history, elided)


def latest_run(store: RunStore, conversation_id: str) -> str:
    """The run a new question on a conversation continues: its newest."""
    runs = store.conversation(conversation_id)
    if not runs:
        raise ConfigError(f"no conversation {conversation_id} in {store.path}")
    return runs[-1].run_id


def prefix(store: RunStore, record: RunRecord, *, own: bool = False) -> tuple[list[Item], set[str]]:
    """The items before `record`'s own question (with `own`: through its answer), and the
    call ids elided among them, decided by any run of the chain."""
    chain: list[RunRecord] = []
    seen: set[str] = set()
    parent = record.run_id if own else record.config.continues_from
    while parent is not None:
        if parent in seen:
            raise ConfigError(f"run {record.run_id}'s conversation loops back to run {parent}")
        seen.add(parent)
        earlier = store.get_run(parent)
        if earlier is None:
            raise ConfigError(f"run {record.run_id} continues run {parent}, which is not stored")
        chain.append(earlier)
        parent = earlier.config.continues_from
    elided = set(store.elided(record.run_id)) if not own else set()
    items: list[Item] = []
    for earlier in reversed(chain):
        elided |= {_name(earlier.run_id, call_id) for call_id in store.elided(earlier.run_id)}
        items.extend(_run_items(store, earlier, items))
    return items, elided


def resumed(store: RunStore, point: ResumePoint) -> ResumePoint:
    """A stored follow-up taken over (`keel resume`): its conversation's history first."""
    if point.record.config.continues_from is None:
        return point
    items, elided = prefix(store, point.record)
    return dataclasses.replace(
        point, history=[*items, *point.history], elided=point.elided | elided
    )


def _name(run_id: str, call_id: str) -> str:
    """An earlier run's call as the conversation names it; a name with a `/` is one already
    (an item of a run before that one, elided by a follow-up)."""
    return call_id if "/" in call_id else f"{run_id}/{call_id}"


def _run_items(store: RunStore, record: RunRecord, before: list[Item]) -> list[Item]:
    """One ended run's items as its own context held them, then its answer, named apart; its
    calls' wire ids as that run chose them, after the conversation's items `before` it."""
    events = store.events(record.run_id)
    own, batch = rebuild_items(events)
    if batch is not None:  # the run ended before answering every call of its last turn
        own.extend(batch.answered.get(c.id) or _unanswered(c, record) for c in batch.calls)
    answer = _answer(events)
    if answer is not None:
        own.append(answer)
    wire = wire_call_ids([*before, *own])
    return [_named_apart(item, record.run_id, wire) for item in own]


def _unanswered(call: ToolCall, record: RunRecord) -> ToolResult:
    """A call the run ended before answering: every call needs its result in a request (the
    providers refuse a call without one), so the follow-up tells the model it never ran."""
    text = f"not run: run {record.run_id} ended ({record.status}) before this call was answered"
    return ToolResult(call.id, call.name, call.key, text, is_error=True, size=len(text),
                      digest=digest_text(text))  # fmt: skip


def _answer(events: list[Event]) -> AssistantMessage | None:
    """The response the run ended on: its last, when it called no tools and the run
    completed (a run failed on a limit has no answer to carry)."""
    if not any(isinstance(e, RunCompleted) for e in events):
        return None
    for event in reversed(events):
        if isinstance(event, ModelResponseReceived):
            if event.tool_calls or not event.text:
                return None
            return AssistantMessage(event.text, (), event.provider_details)
    return None


def _named_apart(item: Item, run_id: str, wire: dict[str, str]) -> Item:
    if isinstance(item, AssistantMessage) and item.tool_calls:
        calls = tuple(
            dataclasses.replace(c, id=_name(run_id, c.id), provider_id=wire[c.id])
            for c in item.tool_calls
        )
        return dataclasses.replace(item, tool_calls=calls)
    if isinstance(item, ToolResult):
        return dataclasses.replace(item, call_id=_name(run_id, item.call_id))
    return item


def _not_ended(record: RunRecord) -> str:
    if record.status in OVER:  # failed on something other than a limit
        return (
            f"run {record.run_id} was {record.status}; only a completed run, or one that failed "
            "on a limit, can be asked a follow-up"
        )
    return (
        f"run {record.run_id} has not ended ({record.status}): resume it first "
        f"(keel resume {record.run_id}), then ask the follow-up"
    )
