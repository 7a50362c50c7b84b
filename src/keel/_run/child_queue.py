"""Where a delegation hands its child when the run is advanced by a `keel worker` (ADR 0069).

A worker on a Postgres store sets `CHILD_QUEUE` around each run it advances. A delegation that
finds one records its child as a queued run any worker may take (with the settings a worker
needs to rebuild it) instead of running it in this process, and its parent pauses
`awaiting_children` without holding a worker. Without one (SQLite, `keel run`, the library),
children run in-process as ADR 0046 describes. The queue itself lives with the workers
(`keel/pool/children.py`): this module only names what a delegation needs of it, so the library
never imports the workers' dependencies.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Protocol

from keel.records import RunConfig

__all__ = ["CHILD_QUEUE", "ChildQueue"]


class ChildQueue(Protocol):
    def enqueue_child(self, run_id: str, task: str, config: RunConfig) -> None:
        """Record the child as a queued run (nothing if a run of that id exists) and hand it
        to the workers; a crash before the hand-on is found by the workers' rescue."""
        ...

    def hand_on_decided(self, run_id: str) -> None:
        """A child paused for a person whose calls are all decided: queue it again."""
        ...


CHILD_QUEUE: ContextVar[ChildQueue | None] = ContextVar("keel_child_queue", default=None)
"""The workers' queue, while a worker advances a run; None: children run in-process."""
