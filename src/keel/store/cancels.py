"""Cancelling a tree of runs in the store (ADR 0066): durable, so it reaches every process.

`keel cancel`, the library's `cancel_tree`, A2A `CancelTask` and AG-UI record a request for
the run and for every descendant it has (children, grandchildren: runs whose `parent_run` leads
back to it), in one transaction. What happens to each run of the tree then:

    ended (completed, failed, cancelled)     nothing
    advanced by a live process (its lease)   the request waits: that process sees it within
                                             CANCEL_POLL seconds and cancels its run, whose
                                             in-flight calls stop; it ends `cancelled`
    anything else (paused, queued, a dead    ended `cancelled` here, at once (its event
    holder's)                                recorded), the request met

A run that opens (a child started after the cancel was recorded, a queued run a worker takes
up) asks whether it or any run above it has a request: if so, it ends `cancelled` before it
calls a model. A run that ends `cancelled` meets its own request, so a later `keel resume`
continues it as any interrupted run.

Both stores keep only their SQL; what a run's record becomes is decided here once.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from keel.records import Ending, RunCancelled, RunState
from keel.result import TERMINAL

__all__ = ["CANCEL_POLL", "ended_cancelled", "is_live", "still_open"]

CANCEL_POLL = 0.5
"""Seconds between a running run's looks at the store for a cancel request: the longest a
cancel recorded elsewhere waits before the run stops its in-flight calls."""


def still_open(status: str) -> bool:
    """A run a cancel still concerns: it has not ended."""
    return status not in TERMINAL


def is_live(status: str, owner: str | None, until: float | None, now: float) -> bool:
    """A process advances the run now: it runs and its lease holds."""
    from keel.store.protocol import holder_alive

    return (
        status == "running"
        and owner is not None
        and until is not None
        and until > now
        and holder_alive(owner)
    )


def ended_cancelled(state_json: str, next_seq: Callable[[], int]) -> tuple[RunCancelled, RunState]:
    """A run nobody advances, ended `cancelled` where it stands: the event to log (its seq from
    `next_seq`) and the state that records the ending, for the store to write both."""
    state = RunState.decode(json.loads(state_json))
    state.end(Ending.cancelled(state.step))
    seq = next_seq()
    event = RunCancelled(step=state.step, seq=seq, at=time.time())
    state.next_seq = seq + 1
    return event, state
