"""Children any worker may take (ADR 0069): a delegation's child as a queued run of its own, and
its parent queued again when the last child of its batch has ended.

    a delegation (in a worker)      the child recorded `queued`, with its own settings and
                                    carved limits, and a dispatch row; then enqueued
    the parent's batch              pauses `awaiting_children`: its lease released, no worker
                                    held while its children run
    a child ends (any ending, or    its parent, if `awaiting_children` with no child open
    paused for a person)            (queued, running, waiting for children of its own), is
                                    set `queued` and handed on: a guarded UPDATE under the
                                    parent's row lock, so of children ending at once exactly
                                    one queues it
    the parent resumes              its delegations run again and read each child's answer

What can go wrong between two of these is found by the workers' rescue: a child recorded but
never enqueued is a queued run whose workflow does not exist (`Dispatch.rescue`); a child whose
worker died after it ended but before it queued its parent, or a parent that paused after its
last child had ended, is found by `wake_stranded` (every rescue round).
"""

from __future__ import annotations

import json
import time
from typing import Any

import psycopg

from keel.failpoints import failpoint
from keel.pool.dispatch import Dispatch
from keel.records import RunConfig, RunState
from keel.result import BUSY
from keel.store.postgres_store import insert_run

__all__ = ["QueuedChildren"]

Conn = psycopg.Connection[Any]

_OPEN = "FROM keel.runs WHERE (config::jsonb ->> 'parent_run') = %s AND status = ANY(%s)"
"""A run's children that have not ended (`runs_by_parent` finds them)."""
_OPEN_CHILDREN = "SELECT count(*) " + _OPEN


class QueuedChildren:
    """The workers' side of queued children (`keel._run.child_queue.ChildQueue`)."""

    def __init__(self, dispatch: Dispatch) -> None:
        self.dispatch = dispatch
        self.store = dispatch.store

    def enqueue_child(self, run_id: str, task: str, config: RunConfig) -> None:
        def write(conn: Conn) -> bool:
            found = conn.execute("SELECT 1 FROM keel.runs WHERE run_id = %s", (run_id,)).fetchone()
            if found is not None:  # recorded before a crash: the rescue enqueues it if need be
                return False
            state = RunState(status="queued")
            insert_run(conn, run_id, task, config.model, config, state, "queued")
            conn.execute(
                "INSERT INTO keel.dispatch (run_id, attempt, handed_at) VALUES (%s, 1, %s)",
                (run_id, time.time()),
            )
            return True

        if self.store.run_sql(write, f"child run {run_id} could not be queued; nothing was saved"):
            failpoint("child_recorded")  # recorded, not enqueued: the rescue's to find
            self.dispatch.enqueue(run_id, 1)

    def hand_on_decided(self, run_id: str) -> None:
        self.dispatch.hand_on(run_id)

    def wake_parent(self, parent_run: str) -> bool:
        """Queue `parent_run` again if it waits for children and none is open any more; True
        if this call did (exactly one of several children ending at once does)."""

        def write(conn: Conn) -> bool:
            row = conn.execute(
                "SELECT status, state FROM keel.runs WHERE run_id = %s FOR UPDATE", (parent_run,)
            ).fetchone()
            if row is None or row[0] != "awaiting_children":
                return False
            counted = conn.execute(_OPEN_CHILDREN, (parent_run, list(BUSY))).fetchone()
            if counted is None or counted[0]:
                return False
            state = RunState.decode(json.loads(row[1]))
            state.status = "queued"
            state.waiting = ()
            conn.execute(
                "UPDATE keel.runs SET status = 'queued', state = %s, updated_at = %s"
                " WHERE run_id = %s",
                (json.dumps(state.encode()), time.time(), parent_run),
            )
            return True

        woken = self.store.run_sql(write, f"run {parent_run} could not be queued again")
        if woken:
            self.dispatch.hand_on(parent_run)
        return bool(woken)

    def cancel_open_children(self, run_id: str) -> list[str]:
        """`run_id` ended `cancelled`: cancel its children that have not ended (and theirs).
        Its own request is met and gone by then, so a child it queued after the cancel was
        recorded would otherwise find no request above it when a worker opens it."""

        def read(conn: Conn) -> list[str]:
            rows = conn.execute("SELECT run_id " + _OPEN, (run_id, list(BUSY))).fetchall()
            return [str(r[0]) for r in rows]

        found = self.store.run_sql(read, f"the children of {run_id} could not be read")
        for child in found:
            self.store.request_cancel(child)
        return found

    def wake_stranded(self) -> list[str]:
        """Every parent that waits for children none of which is open (the child that ended
        last died before it queued its parent, or the parent paused after its last child
        ended): each queued again."""

        def read(conn: Conn) -> list[str]:
            rows = conn.execute(
                "SELECT p.run_id FROM keel.runs p WHERE p.status = 'awaiting_children'"
                " AND NOT EXISTS (SELECT 1 FROM keel.runs c"
                " WHERE (c.config::jsonb ->> 'parent_run') = p.run_id AND c.status = ANY(%s))",
                (list(BUSY),),
            ).fetchall()
            return [str(r[0]) for r in rows]

        found = self.store.run_sql(read, "the runs waiting for children could not be read")
        return [run_id for run_id in found if self.wake_parent(run_id)]
