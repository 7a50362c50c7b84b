"""The ways a run opens, as values: each opens itself against a store, and `Agent.launch` starts
whatever it opened in the one place that traces, sets up and starts a loop.

    Fresh       a new question; with `conversation`, a follow-up on that conversation's newest run
    FollowUp    a new question on an ended run (`keel ask`), or a fork of its conversation
    Resumed     a stored run that has not ended, from its last step (`keel resume`, a worker)
    Queued      a run `keel submit` recorded, started by a worker
    Child       a sub-agent's run, started by its parent's delegation call (ADR 0046)
    Forked      a run whose first steps are copied from another's or a recording's (ADR 0051)

Opening reads the store and nothing else: an unknown run, a run that cannot be resumed or
asked again, or a question that is not text is refused before anything is traced or written.
"""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from keel._run import history, resume
from keel._run.resume import ResumePoint
from keel.errors import ConfigError
from keel.limits import Limits
from keel.records import JsonObject, Lineage
from keel.store import RunStore

if TYPE_CHECKING:
    from keel._run.fork import ForkPrefix

__all__ = [
    "Child",
    "FollowUp",
    "Forked",
    "Fresh",
    "Opened",
    "Opening",
    "Queued",
    "Resumed",
    "new_run_id",
]


def new_run_id() -> str:
    return "run_" + uuid.uuid4().hex[:16]


@dataclass(frozen=True, slots=True)
class Opened:
    """What a run opens with, besides what its agent brings (model, tools, limits)."""

    run_id: str
    question: str
    lineage: Lineage = field(default_factory=Lineage)
    limits: Limits | None = None
    """A stored or carved run's own limits; None: the agent's."""
    settings: JsonObject = field(default_factory=dict)
    """Saved with the run beside the agent's own (a fork's origin)."""
    stored: JsonObject | None = None
    """A stored run's settings (its output shape); None: a run not yet in the store."""
    trace_from: JsonObject | None = None
    """Saved settings whose trace the run's spans continue (a resumed run's)."""
    point: ResumePoint | None = None
    """Where a stored run stands; None: it starts from its question."""
    follow: history.Continuation | None = None
    """The conversation's history a follow-up starts with."""
    fork: ForkPrefix | None = None
    """The prefix a fork is created with (in the same transaction as the run)."""
    queued: bool = False
    store: RunStore | None = None
    """The run's store when not the agent's (a child's is its parent's)."""
    lease_owner: str | None = None
    """A lease the caller already holds on the run (a worker)."""

    @property
    def is_new(self) -> bool:
        """The run's record is written by this opening (its settings saved with it)."""
        return self.point is None and not self.queued


class Opening(Protocol):
    def open(self, store: RunStore) -> Opened: ...


def _text(question: str) -> str:
    try:
        question.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ConfigError(
            f"the question is not valid text: it holds {exc.object[exc.start : exc.end]!r} "
            "(bytes that are not UTF-8?)"
        ) from None
    return question


def _following(question: str, follow: history.Continuation) -> Opened:
    lineage = Lineage(follow.conversation_id, follow.continues_from)
    return Opened(new_run_id(), _text(question), lineage, follow=follow)


@dataclass(frozen=True, slots=True)
class Fresh:
    question: str
    conversation: str | None = None
    """A conversation's id: the question follows up on its newest run."""

    def open(self, store: RunStore) -> Opened:
        if self.conversation is None:
            return Opened(new_run_id(), _text(self.question))
        latest = history.latest_run(store, self.conversation)
        return _following(self.question, history.continuation(store, latest))


@dataclass(frozen=True, slots=True)
class FollowUp:
    run_id: str
    question: str
    fork: bool = False
    """Continue from a run the conversation has gone on from, as a new conversation."""

    def open(self, store: RunStore) -> Opened:
        follow = history.continuation(store, self.run_id, fork=self.fork)
        return _following(self.question, follow)


@dataclass(frozen=True, slots=True)
class Resumed:
    run_id: str
    store: RunStore | None = None
    """The run's store when not the agent's (a child run lives in its parent's)."""
    lease_owner: str | None = None

    def open(self, store: RunStore) -> Opened:
        store = self.store or store
        record = store.get_run(self.run_id)
        if record is not None and record.status == "queued" and record.state.next_seq == 0:
            # queued and never started (a child queued for the workers, ADR 0069): it starts
            # from its question, in this process
            opened = Queued(self.run_id, self.lease_owner).open(store)
            return dataclasses.replace(opened, store=self.store)
        point = history.resumed(store, resume.load(store, self.run_id))
        saved = point.record.config.settings
        origin = saved.get("forked_from")  # a fork resumed says it still
        return Opened(
            self.run_id,
            point.record.question,
            point.record.config.lineage,
            limits=point.record.config.limits,
            settings={"forked_from": origin} if isinstance(origin, dict) else {},
            stored=saved,
            trace_from=saved,
            point=point,
            store=self.store,
            lease_owner=self.lease_owner,
        )


@dataclass(frozen=True, slots=True)
class Queued:
    run_id: str
    lease_owner: str | None = None

    def open(self, store: RunStore) -> Opened:
        record = store.get_run(self.run_id)
        if record is None or record.status != "queued":
            found = record.status if record else "no such run"
            raise ConfigError(f"run {self.run_id} is not waiting to start ({found})")
        return Opened(
            self.run_id,
            record.question,
            record.config.lineage,  # a queued child's parent (ADR 0069)
            limits=record.config.limits,
            stored=record.config.settings,
            queued=True,
            lease_owner=self.lease_owner,
        )


@dataclass(frozen=True, slots=True)
class Child:
    """`run_id` named after the parent's call; `limits` carved from the parent's."""

    task: str
    run_id: str
    parent_run: str
    parent_call: str
    agent: str
    """The delegation tool's name."""
    limits: Limits
    store: RunStore | None

    def open(self, store: RunStore) -> Opened:
        lineage = Lineage(
            parent_run=self.parent_run, parent_call=self.parent_call, agent=self.agent
        )
        return Opened(self.run_id, self.task, lineage, limits=self.limits, store=self.store)


@dataclass(frozen=True, slots=True)
class Forked:
    """A fork from a prefix already derived (`keel._run.fork.prefix_of_run`, or a recording's:
    `keel.replay.forks`); `ForkOf` derives it from a stored run."""

    prefix: ForkPrefix

    def open(self, store: RunStore) -> Opened:
        prefix = self.prefix
        return Opened(
            new_run_id(),
            prefix.question,
            Lineage(continues_from=prefix.continues_from),
            settings={"forked_from": prefix.origin},
            fork=prefix,
        )


@dataclass(frozen=True, slots=True)
class ForkOf:
    """A fork of stored run `run_id` at step `at` (as `keel show` numbers steps)."""

    run_id: str
    at: int

    def open(self, store: RunStore) -> Opened:
        from keel._run.fork import prefix_of_run

        return Forked(prefix_of_run(store, self.run_id, self.at)).open(store)
