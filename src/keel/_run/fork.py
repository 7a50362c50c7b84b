"""A fork's prefix: a run's first STEP steps, copied from its record, and what stood after them.

A fork (`Agent.fork`, `keel fork`, ADR 0051) is a new run whose first STEP steps are another
run's: its events through that step are copied (the question, every model request and response,
tool call, journal entry, result, elision, evidence reset and decision; seq renumbered, times
kept), nothing is sent to a model and no tool runs for them. What the loop keeps besides the
events is re-computed from the copied events, by the loop's own code where there is one:

    counters     each accepted batch counted with `IdenticalCallBreaker.record`, each result
                 that came back settled with `IdenticalCallBreaker.settle`, in request order,
                 under the original's loop policy, threshold, reset cap and repeat tiers
                 (each result `answered` too), exactly as `step._accept_batch` and
                 `batch._apply_evidence_resets` call them (a result saved before a crash was
                 never settled, and is not here either)
    state        each event folded by the ledger (keel.ledger: spend, calls, retries,
                 decisions, effects left unknown) and each answered child's spend with
                 `ledger.fold_child`, as the loop folds them; then the step, the denials by
                 key and the world version
    elisions     the `result_elided` events of the prefix

A decision on a call the prefix holds no result of (the original paused for it, a person
decided, nobody resumed it yet) is not copied: it was given for the original's call, and the
fork asks again (ADR 0051). One approval never gives two side effects (ADR 0062, FK-01).

The same function takes a recording from another runtime (`keel/replay/forks.py` turns
it into events first), so a fork of a Keel run and a fork of a recording are made alike.
Nothing here writes but `create_fork`, which `Agent.launch` calls to create the run with the
prefix in one transaction.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from keel import ledger
from keel._run import history
from keel._run.breaker import IdenticalCallBreaker
from keel._run.hosted_calls import count_hosted
from keel._run.loop import RunLoop
from keel._run.resume import ResumePoint, rebuild_items
from keel.errors import ConfigError
from keel.limits import Limits
from keel.records import (
    ApprovalDecided,
    Event,
    HostedToolCalled,
    JsonObject,
    KeyCounter,
    ModelRequestSent,
    ModelResponseReceived,
    OutputRejected,
    ResultElided,
    RunCancelled,
    RunCompleted,
    RunConfig,
    RunFailed,
    RunResumed,
    RunState,
    ToolCallRequested,
    ToolDispatched,
    ToolResultRecorded,
)
from keel.result import ChildRun
from keel.store import RunRecord, RunStore

__all__ = ["ForkPrefix", "create_fork", "derive", "fork_point", "forked_from", "prefix_of_run"]

_NOT_COPIED = (RunResumed, RunCompleted, RunFailed, RunCancelled)
"""Marks of the original's processes and its end: not steps, so not part of any prefix."""


@dataclass(frozen=True, slots=True)
class ForkPrefix:
    """What a fork starts from: its question, the copied events, and what stood after them."""

    question: str
    events: list[Event]
    state: RunState
    counters: dict[str, KeyCounter]
    elisions: list[tuple[str, int]]
    """(call_id, step) of the results elided in the prefix."""
    origin: JsonObject
    """Where the fork came from (`forked_from`): {"run_id", "step"} or, for a recording,
    {"recording", "id", "step"}."""
    continues_from: str | None = None
    """The original's own conversation prefix (a fork of a follow-up keeps its history)."""


def forked_from(settings: JsonObject) -> JsonObject | None:
    """A stored run's fork origin, from its settings; None: not a fork."""
    origin = settings.get("forked_from")
    return origin if isinstance(origin, dict) else None


def prefix_of_run(store: RunStore, run_id: str, at: int) -> ForkPrefix:
    """The prefix of stored run `run_id` through step `at` (as `keel show` numbers steps).
    Raises ConfigError for an unknown run or a step that cannot be forked at."""
    record = store.get_run(run_id)
    if record is None:
        raise ConfigError(f"no run {run_id} in {store.path}")
    events = store.events(run_id)
    _check_step(record, events, at)
    origin: JsonObject = {"run_id": run_id, "step": at}
    upstream = forked_from(record.config.settings)
    if upstream is not None:  # a fork of a fork: say the whole line
        origin["from"] = upstream
    return derive(
        record.question,
        [e for e in events if e.step <= at],
        record.config.limits,
        at,
        origin,
        children=record.state.children,
        continues_from=record.config.continues_from,
    )


def fork_point(
    store: RunStore | None, run_id: str, model: str, config: RunConfig, prefix: ForkPrefix
) -> ResumePoint:
    """Where the fork's loop takes over: the prefix's history rebuilt as `resume` rebuilds a
    stored run's (with the original's conversation before it, for a fork of a follow-up),
    its counters, elisions and any batch the prefix left open."""
    now = time.time()
    state = prefix.state.copy()
    record = RunRecord(run_id, now, now, prefix.question, model, "running", config, state)
    items, batch = rebuild_items(prefix.events)
    counters = {key: replace(counter) for key, counter in prefix.counters.items()}
    elided = {call_id for call_id, _ in prefix.elisions}
    point = ResumePoint(record, state, counters, elided, items, batch)
    return point if store is None else history.resumed(store, point)


async def create_fork(loop: RunLoop, prefix: ForkPrefix) -> None:
    """Create the fork's run with the prefix's events, counters and elisions, in one
    transaction, before its loop takes it over."""
    setup = loop.setup
    if setup.store is None:
        return
    await setup.store.create_run(
        loop.run_id,
        prefix.question,
        setup.config.model,
        setup.config,
        prefix.state.copy(),
        lease=loop.lease.owner,
        lease_ttl=loop.lease.ttl,
        events=prefix.events,
        counters=prefix.counters,
        elisions=prefix.elisions,
    )


def derive(
    question: str,
    events: Sequence[Event],
    limits: Limits,
    at: int,
    origin: JsonObject,
    *,
    children: dict[str, ChildRun] | None = None,
    continues_from: str | None = None,
) -> ForkPrefix:
    """The prefix made of `events` (the original's through step `at`), counted under the
    original's `limits`; `children`: the original's answered children, by its call id."""
    answered = {e.call_id for e in events if isinstance(e, ToolResultRecorded)}
    events = [e for e in events if not _undelivered(e, answered)]
    copied: list[Event] = []
    for event in events:
        if isinstance(event, _NOT_COPIED):
            continue
        copied.append(replace(event, seq=len(copied)))
    state = RunState(step=at)
    state.next_seq = len(copied)
    breaker = IdenticalCallBreaker(
        limits.loop_threshold,
        limits.evidence_reset_cap,
        policy=limits.loop_policy,
        tiers=limits.repeat_tiers,
    )
    _count(events, state, breaker, children or {})
    state.world = breaker.world
    state.repeats = breaker.repeats
    elisions = [(e.call_id, e.step) for e in copied if isinstance(e, ResultElided)]
    return ForkPrefix(question, copied, state, breaker.counters, elisions, origin, continues_from)


def _undelivered(event: Event, answered: set[str]) -> bool:
    """A decision on a call that has no result in the prefix: the original's, not the fork's."""
    return isinstance(event, ApprovalDecided) and event.call_id not in answered


def _count(
    events: Sequence[Event],
    state: RunState,
    breaker: IdenticalCallBreaker,
    children: dict[str, ChildRun],
) -> None:
    """Walk the original's events as its loop made them: the ledger folds each (spend,
    decisions, effects left unknown), the breaker counts as the loop counted."""
    requested_at: float | None = None
    effects: dict[str, str | None] = {}
    order: dict[str, int] = {}
    settle: list[ToolResultRecorded] = []
    dispatched: set[str] = set()
    journaled: set[str] = set()
    batch_step = -1
    requested = {
        (e.step, e.call_id): e.call_key for e in events if isinstance(e, ToolCallRequested)
    }

    def settle_batch() -> None:
        """The results the batch's last process got back, in request order (what
        `batch._apply_evidence_resets` settles): results of a process that died before the
        batch ended were never settled, and a denied, refused or unknown call never ran."""
        for result in sorted(settle, key=lambda r: order.get(r.call_id, 0)):
            if result.call_id in journaled or not ledger.spent_by(result, state.decisions):
                continue  # it never ran in the batch's last process
            effect = effects.get(result.call_id)
            if not result.is_error:
                breaker.settle(
                    result.call_key,
                    result.digest,
                    observation=effect == "observation",
                    side_effect=effect == "side_effecting",
                )
            if effect is not None:  # a known tool's result: the repeat tiers count it
                breaker.answered(
                    result.call_key,
                    result.name,
                    result.digest,
                    error=result.is_error,
                    empty=not result.content.strip(),
                    side_effect=effect == "side_effecting",
                )
        settle.clear()

    for event in events:
        if isinstance(event, ModelRequestSent):
            requested_at = event.at
        elif isinstance(event, ModelResponseReceived):
            settle_batch()
            if event.took is None and requested_at is not None and event.at >= requested_at:
                event = replace(event, took=event.at - requested_at)  # stored before `took`
            requested_at = None
            order = {c.id: n for n, c in enumerate(event.tool_calls)}
            batch_step = event.step
            keys = [requested.get((event.step, c.id)) for c in event.tool_calls]
            if keys and all(k is not None for k in keys):  # the loop accepted the batch
                breaker.record([k for k in keys if k is not None])  # as `_accept_batch` does
        elif isinstance(event, HostedToolCalled):  # counted as the loop counted it
            count_hosted(breaker, event)
        elif isinstance(event, ToolCallRequested):
            effects[event.call_id] = event.effect
        elif isinstance(event, ToolDispatched):
            dispatched.add(event.call_id)
        elif isinstance(event, RunResumed):
            journaled |= dispatched  # dispatched, no result: answered "effect unknown"
            if event.step == batch_step:
                settle.clear()  # the process before this one died before the batch settled
        elif isinstance(event, ToolResultRecorded):
            dispatched.discard(event.call_id)
            settle.append(event)
        elif isinstance(event, OutputRejected):
            settle_batch()
        ledger.apply(state, event)
        if isinstance(event, ToolResultRecorded):
            child = children.get(event.call_id)
            if child is not None:
                ledger.fold_child(state, event.call_id, child)
            decision = state.decisions.get(event.call_id)
            if decision is not None and not decision.approved:
                state.denied.setdefault(event.call_key, decision)
    settle_batch()


def _check_step(record: RunRecord, events: Sequence[Event], at: int) -> None:
    """A step can be forked at when its turn is in the record and went on: 0 (the question
    alone), a turn whose calls the loop accepted (answered or not: an unanswered call is
    answered in the fork, a dispatched side effect "effect unknown"), or an answer the
    output schema rejected. Not the answer that ended the run, a turn whose calls the loop
    refused (its hard limit, a synthesis turn), or a step without a response."""
    last = max((e.step for e in events), default=0)
    name = record.run_id
    if at < 0 or at > last:
        raise ConfigError(f"run {name} has steps 0 to {last}; there is no step {at} to fork at")
    if at == 0:
        return
    step_events = [e for e in events if e.step == at]
    responses = [e for e in step_events if isinstance(e, ModelResponseReceived)]
    if any(isinstance(e, OutputRejected) for e in step_events):
        return
    if not responses or not responses[-1].tool_calls:
        what = "the answer that ended it" if responses else "no model response"
        raise ConfigError(
            f"step {at} of run {name} holds {what}: nothing to continue from there; fork at "
            f"step {at - 1} to have the turn taken again"
        )
    calls = responses[-1].tool_calls
    if not any(isinstance(e, ToolCallRequested) and e.call_id == calls[0].id for e in step_events):
        raise ConfigError(
            f"step {at} of run {name} asked for calls its loop refused (a limit ended the run "
            f"there); fork at step {at - 1} to have the turn taken again"
        )
