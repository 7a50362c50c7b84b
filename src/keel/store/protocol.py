"""What Keel needs from a run store, as a Protocol: the run loop, resume, approvals, evaluations
and `keel runs`/`keel show` use these methods and nothing else, so the embedded SQLite store and
the Postgres store are interchangeable.

The promises every implementation keeps (the store behaviour tests run against each):
- a step is saved whole or not at all, in one transaction that writes only what it added;
- the lease is checked before a step's events are written: a holder whose run was taken over
  gets LeaseLost and writes nothing; a lease whose holder died is lost when it expires;
- every failure of the database leaves as a StoreError (or ConfigError for misuse) with one
  line that says what happened and what to do, never naming a password;
- runs, events, counters and state cross the boundary as the typed records of `records.py`.

What both stores do alike lives here once: decoding run and event rows, and deciding a pending
call (`decide_pending`); each store keeps only its SQL.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Protocol, runtime_checkable

from keel import ledger
from keel.errors import AlreadyDecided, ConfigError
from keel.inbound import clean_text
from keel.records import (
    ApprovalDecided,
    Decision,
    Event,
    KeyCounter,
    RunConfig,
    RunState,
    ToolResultRecorded,
    decode_event,
)
from keel.result import RunStatus

__all__ = [
    "EXPIRED_BY",
    "HOST",
    "Checkpoint",
    "RunRecord",
    "RunStore",
    "already_decided",
    "decide_pending",
    "decode_events",
    "expired_denial",
    "holder_alive",
    "new_lease_owner",
]

HOST = socket.gethostname()


@dataclass(frozen=True, slots=True)
class RunRecord:
    """A stored run as `keel runs`, `keel show` and resume see it."""

    run_id: str
    created_at: float
    updated_at: float
    question: str
    model: str
    status: RunStatus
    config: RunConfig
    state: RunState

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> RunRecord:
        """The row every store selects: id, times, question, model, status, config and state
        as JSON text."""
        run_id, created, updated, question, model, status, config, state = row
        return cls(
            run_id,
            created,
            updated,
            question,
            model,
            status,
            RunConfig.decode(json.loads(config)),
            RunState.decode(json.loads(state)),
        )

    @property
    def conversation_id(self) -> str:
        """The conversation the run belongs to: its first run's id (this run's, if it began
        one)."""
        return self.config.conversation_id or self.run_id


@dataclass(slots=True)
class Checkpoint:
    """What one step adds to the store; saved in one transaction."""

    run_id: str
    state: RunState
    events: list[Event] = field(default_factory=list)
    counters: dict[str, KeyCounter] = field(default_factory=dict)
    elisions: list[tuple[str, int]] = field(default_factory=list)
    """(call_id, step) of results newly elided."""
    blobs: list[tuple[str, str]] = field(default_factory=list)
    """(digest, text) of results kept whole because the model saw them truncated."""
    lease: str | None = None
    """The writer's lease: the checkpoint is refused if another process took the run over."""
    lease_ttl: float = 0.0
    release: bool = False
    """Let go of the lease (the run finished, paused, or was handed to another process)."""
    watch: tuple[str, ...] = ()
    """Runs whose cancel request stops this one (its own id, its ancestors'): looked up in
    the step's transaction (keel/store/cancels.py), the answer left in `cancel_found`."""
    cancel_found: bool = False


@runtime_checkable
class RunStore(Protocol):
    """A run store. `path` names it in messages: a file path, or a URL without its password."""

    path: str

    async def create_run(
        self,
        run_id: str,
        question: str,
        model: str,
        config: RunConfig,
        state: RunState,
        *,
        lease: str | None = None,
        lease_ttl: float = 0.0,
        events: Sequence[Event] = (),
        counters: Mapping[str, KeyCounter] | None = None,
        elisions: Sequence[tuple[str, int]] = (),
    ) -> None:
        """Record a new run, with its first events (the question), in one transaction; a
        fork (keel/_run/fork.py) starts with its copied prefix's events, `counters` and
        `elisions` (call_id, step), written in the same transaction."""

    async def save_step(self, checkpoint: Checkpoint) -> None:
        """Save one step whole, or raise LeaseLost (taken over) or StoreError (not saved)."""

    async def acquire_lease(self, run_id: str, owner: str, ttl: float) -> None:
        """Take the run for `owner`, or raise LeaseHeld naming the live holder."""

    async def renew_lease(self, run_id: str, owner: str, ttl: float) -> None:
        """Extend `owner`'s lease, or raise LeaseLost."""

    def decide(
        self,
        run_id: str,
        call_id: str,
        *,
        approved: bool,
        by: str,
        reason: str | None = None,
        detail: Decision | None = None,
        expect_key: str | None = None,
    ) -> ApprovalDecided:
        """Record a person's decision on a pending call of a paused run. Final: deciding a
        call decided already raises AlreadyDecided, and of racing decisions exactly one is
        recorded (the others get AlreadyDecided). `detail`: the whole decision (edited
        arguments, an answer, for the run), which `approved`, `by` and `reason` then only
        repeat; `expect_key`: the key of the call the decider saw, refused (ConfigError,
        nothing recorded) when the pending call's differs. Past the call's expiry the denial
        it turned into is recorded instead, its event `expired`."""

    def request_cancel(self, run_id: str) -> list[str]:
        """Cancel the run and every descendant, durably (keel/store/cancels.py): a run no
        process advances ends `cancelled` at once; a live one is asked to, and its process
        sees the request. Returns the ids of the tree's runs that had not ended."""

    def cancel_requested(self, run_id: str, parent_run: str | None = None) -> bool:
        """Whether the run, or a run above it, has a cancel request not yet met; `parent_run`:
        the parent of a run not in the store yet (a child opening)."""

    def forget_cancel(self, run_id: str) -> None:
        """The run ended `cancelled`: its request is met."""

    def get_run(self, run_id: str) -> RunRecord | None: ...

    def list_runs(
        self, limit: int = 20, status: str | None = None, offset: int = 0
    ) -> list[RunRecord]:
        """Newest first; `status` keeps only runs with that status, `offset` pages on."""

    def count_runs(self, status: str | None = None) -> int: ...

    def conversation(self, conversation_id: str) -> list[RunRecord]:
        """The runs of a conversation, oldest first (empty: no such conversation)."""

    def events(self, run_id: str, after: int = -1) -> list[Event]:
        """The run's events in order (after seq `after`); a tool result's `elided` is set from
        the elisions."""

    def counters(self, run_id: str) -> dict[str, KeyCounter]: ...

    def elided(self, run_id: str) -> set[str]: ...

    def blob(self, digest: str) -> str | None: ...

    def close(self) -> None: ...


def decode_events(
    rows: Iterable[Sequence[Any]],
    elided: set[str],
    body: Callable[[str | None], str | None] = lambda text: text,
) -> list[Event]:
    """The event rows every store selects (seq, type, at, data as JSON text, body), decoded like
    `RunRecord.from_row` decodes run rows; `body` undoes a store's own encoding of the body
    column. A tool result's `elided` says whether its call is among the run's elisions."""
    decoded = []
    for seq, type_, at, data, text in rows:
        event = decode_event(type_, seq, at, json.loads(data), body(text))
        if isinstance(event, ToolResultRecorded):
            event.elided = event.call_id in elided
        decoded.append(event)
    return decoded


def decide_pending(
    run_id: str,
    call_id: str,
    row: Sequence[Any],
    next_seq: Callable[[], int],
    decision: Decision,
    expect_key: str | None = None,
    now: float | None = None,
) -> tuple[ApprovalDecided, RunState]:
    """`RunStore.decide` on the run's stored (status, state) `row`, read inside the store's
    transaction with the run's row locked (SQLite: BEGIN IMMEDIATE; Postgres: FOR UPDATE), so
    of several people deciding one call at once exactly one gets here first. A decision is
    final: a call decided already raises AlreadyDecided naming who decided what and when, and
    a call that is not awaiting a decision raises ConfigError. Else: the event to log (its seq
    from `next_seq`) and the state that records the decision, for the store to write both."""
    status, state_json = row
    state = RunState.decode(json.loads(state_json))
    by, reason = clean_text(decision.by), decision.reason  # a name from argv: maybe not UTF-8
    decision = replace(decision, by=by, reason=None if reason is None else clean_text(reason))
    if decision.answer is not None:
        decision = replace(decision, answer=clean_text(decision.answer))
    earlier = state.decisions.get(call_id)
    if earlier is not None:
        raise AlreadyDecided(already_decided(run_id, call_id, earlier))
    pending = {p.call_id: p for p in state.pending}
    if status != "awaiting_approval" or call_id not in pending:
        waiting = ", ".join(pending) or "none"
        raise ConfigError(
            f"run {run_id} has no call {call_id} awaiting a decision "
            f"(status {status}; calls waiting: {waiting})"
        )
    asked = pending[call_id]
    if expect_key is not None and expect_key != asked.call_key:
        raise ConfigError(
            f"call {call_id} of run {run_id} waits as {asked.call_key[:200]}, not as the call "
            f"decided on ({expect_key[:200]}); nothing was recorded"
        )
    at = time.time() if now is None else now
    if asked.expires_at is not None and at > asked.expires_at:
        decision = expired_denial(asked.expires_at)
    decision = replace(decision, at=at, name=asked.name, call_key=asked.call_key)
    seq = next_seq()
    event = ApprovalDecided(
        step=state.step,
        seq=seq,
        at=at,
        call_id=call_id,
        name=asked.name,
        call_key=asked.call_key,
        approved=decision.approved,
        by=decision.by,
        reason=decision.reason,
        arguments=decision.arguments,
        answer=decision.answer,
        for_run=decision.for_run,
        expired=decision.expired,
    )
    ledger.apply(state, event)  # the decision, as the event records it
    if decision.for_run and decision.approved and asked.run_id is None:  # a child's: its own
        state.approved_for_run.setdefault(asked.name, decision)
    state.next_seq = seq + 1
    return event, state


EXPIRED_BY = "approval timeout"
"""Who a denial is recorded as when nobody decided before the pause's expiry."""


def expired_denial(expires_at: float) -> Decision:
    """The denial a call turns into once its approval timed out."""
    when = datetime.fromtimestamp(expires_at, UTC)
    return Decision(
        False,
        EXPIRED_BY,
        f"nobody decided before the approval expired at {when:%Y-%m-%d %H:%M:%S} UTC",
        expired=True,
    )


def already_decided(run_id: str, call_id: str, decision: Decision) -> str:
    """One line for the person who came second: who decided, what, when, and why."""
    verdict = "approved" if decision.approved else "denied"
    when = (
        f" at {datetime.fromtimestamp(decision.at, UTC):%Y-%m-%d %H:%M:%S} UTC"
        if decision.at is not None
        else ""
    )
    why = f": {decision.reason}" if decision.reason else ""
    return (
        f"call {call_id} of run {run_id} was already {verdict} by {decision.by}{when}{why}; "
        "a decision is final"
    )


def new_lease_owner() -> str:
    return f"{HOST}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def holder_alive(owner: str) -> bool:
    """Whether a lease's holder may still live: on this host, its pid says; elsewhere only the
    lease's expiry can tell."""
    host, _, rest = owner.partition(":")
    pid = rest.partition(":")[0]
    if host != HOST or not pid.isdigit():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
