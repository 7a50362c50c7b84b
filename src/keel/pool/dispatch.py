"""Handing runs to the workers: Keel's `dispatch` table and DBOS's queue, kept in step.

Each handing-on of a run is one DBOS workflow, `RUN_ID.N`, N the run's attempt in `dispatch`.
Bumping the attempt is a guarded UPDATE, so of several processes that notice the same stranded
run only one enqueues it again, and DBOS refuses a second workflow of the same id: a run is in
the queue at most once per attempt. The enqueue itself is a second transaction (DBOS's own); a
crash between the two leaves a run whose current workflow does not exist, which `rescue` finds
and hands on.

What DBOS does not do here, Keel does (`rescue`): open-source DBOS recovers only the workflows
of the executor that restarts with the same id, so a worker that dies for good would keep its
runs forever. A run is stranded when it has not ended, no live lease covers it, it was handed on
more than `grace` seconds ago, and its workflow is not waiting in the queue: then it is handed
on again, and the next worker resumes it from its journal. A paused run that a decision handed
on, with every call decided, is stranded the same way when its enqueue never happened.

Rescues are bounded: a run rescued `MAX_RESCUES` times in a row without a tool call answered
in between (its worker dies on it, or the store refuses the same step, every time) is marked
failed with `RescuesExhausted` instead of being taken up again, each time another model call.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg

from keel.errors import ConfigError, RescuesExhausted, StoreError
from keel.records import Ending, RunConfig, RunState
from keel.result import LIVE
from keel.store.postgres_store import NOW, PostgresStore, insert_events, insert_run
from keel.store.protocol import holder_alive

if TYPE_CHECKING:
    from dbos import DBOSClient

__all__ = [
    "APP",
    "APP_VERSION",
    "MAX_RESCUES",
    "QUEUE",
    "WORKFLOW",
    "Decided",
    "Dispatch",
    "hand_on_decided",
    "workflow_id",
]

APP = "keel"
MAX_RESCUES = 5
"""Rescues in a row, with no tool call answered in between, before a stranded run is given up
as failed. A resumed run always takes a new step, so the step number is no measure of progress;
a crash before a step's results are saved leaves the count of answered calls where it was."""
QUEUE = "keel-runs"
WORKFLOW = "keel_run"
APP_VERSION = "keel-1"
"""Pinned, not derived from the code's hash: a redeployed worker must still take the runs that
were queued before it (DBOS dequeues only its own version's workflows). Change it only when the
workflow's arguments change meaning."""

Conn = psycopg.Connection[Any]


@dataclass(frozen=True, slots=True)
class Decided:
    """What a decision on a paused run led to on a Postgres store."""

    waiting: int
    """Calls still waiting for a decision: the run stays paused, nothing is queued."""
    queued: bool
    """Handed to the workers' queue. False with nothing waiting: the queue is not set up yet
    (no `keel worker` has started on this database), so no worker will take the run."""


def hand_on_decided(url: str, run_id: str) -> Decided:
    """`Dispatch.hand_on_decided` on the store at `url`, opened and closed around it: what
    `keel approve`/`deny` and the web view do after a decision on Postgres."""
    store = PostgresStore(url)
    dispatch = Dispatch(store)
    try:
        return dispatch.hand_on_decided(run_id)
    finally:
        dispatch.close()
        store.close()


def _all_decided(state_json: str) -> bool:
    """A paused run was handed on by a decision (it has a `dispatch` row) and every call has
    one: the enqueue after that decision did not happen (no worker had set the queue up yet, or
    the process died between the two), so it is stranded like a queued run."""
    state = RunState.decode(json.loads(state_json))
    return all(p.call_id in state.decisions for p in state.pending)


def _progress(state_json: str) -> int:
    """How far a run has got, for telling rescues in a row apart: its answered tool calls."""
    return RunState.decode(json.loads(state_json)).tool_calls


def workflow_id(run_id: str, attempt: int) -> str:
    return f"{run_id}.{attempt}"


class Dispatch:
    """Keel's side of the queue, over a PostgresStore and the URL of its database."""

    def __init__(self, store: PostgresStore) -> None:
        self.store = store
        self._url = store.url
        self._client: DBOSClient | None = None

    def client(self) -> DBOSClient:
        if self._client is None:
            try:
                from dbos import DBOSClient
            except ImportError:
                raise ConfigError(
                    "workers need DBOS: pip install 'keel-runtime[postgres]'"
                ) from None
            try:
                self._client = DBOSClient(
                    system_database_url=self._url,
                    application_name=APP,
                    retry_connection_errors=False,
                )
            except Exception as exc:
                name = type(exc).__name__
                raise StoreError(
                    f"the queue in {self.store.path} cannot be reached ({name})"
                ) from None
        return self._client

    def close(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.destroy()
            self._client = None

    def submit(self, run_id: str, question: str, model: str, config: RunConfig) -> bool:
        """Record a queued run and hand it to the workers; False: it is recorded, and the first
        worker to start enqueues it (the queue's tables do not exist before one has run)."""

        def write(conn: Conn) -> None:
            state = RunState(status="queued")
            insert_run(conn, run_id, question, model, config, state, "queued")
            conn.execute(
                "INSERT INTO keel.dispatch (run_id, attempt, handed_at) VALUES (%s, 1, %s)",
                (run_id, time.time()),
            )

        self.store.run_sql(write, f"run {run_id} could not be submitted; nothing was saved")
        return self.enqueue(run_id, 1)

    def enqueue(self, run_id: str, attempt: int) -> bool:
        try:
            self.client().enqueue(
                {
                    "workflow_name": WORKFLOW,
                    "queue_name": QUEUE,
                    "workflow_id": workflow_id(run_id, attempt),
                    "app_version": APP_VERSION,
                },
                run_id,
            )
        except (ConfigError, StoreError):
            raise
        except Exception:  # DBOS's tables missing, or the database went away: rescue retries
            return False
        return True

    def hand_on(self, run_id: str, attempt: int | None = None) -> int | None:
        """Queue the run again; `attempt`: only if that is still its current one (so one of
        several processes noticing the same run does it). Returns the new attempt, or None."""
        new = self._next_attempt(run_id, attempt)
        if new is not None:
            self.enqueue(run_id, new)
        return new

    def hand_on_decided(self, run_id: str) -> Decided:
        """After a decision on a paused run (`keel approve`/`deny`, the web view): once no call
        waits for one, queue the run for the workers. Says what happened, so that what a person
        is told is true."""
        record = self.store.get_run(run_id)
        if record is None:
            raise ConfigError(f"no run {run_id} in {self.store.path}")
        waiting = [p for p in record.state.pending if p.call_id not in record.state.decisions]
        if waiting:
            return Decided(waiting=len(waiting), queued=False)
        new = self._next_attempt(run_id, None)
        return Decided(waiting=0, queued=new is not None and self.enqueue(run_id, new))

    def _next_attempt(self, run_id: str, attempt: int | None) -> int | None:
        def write(conn: Conn) -> int | None:
            if attempt is None:
                row = conn.execute(
                    "INSERT INTO keel.dispatch (run_id, attempt, handed_at) VALUES (%s, 1, %s)"
                    " ON CONFLICT (run_id) DO UPDATE SET attempt = keel.dispatch.attempt + 1,"
                    " handed_at = excluded.handed_at RETURNING attempt",
                    (run_id, time.time()),
                ).fetchone()
            else:
                row = conn.execute(
                    "UPDATE keel.dispatch SET attempt = attempt + 1, handed_at = %s"
                    " WHERE run_id = %s AND attempt = %s RETURNING attempt",
                    (time.time(), run_id, attempt),
                ).fetchone()
            return int(row[0]) if row else None

        return self.store.run_sql(write, f"run {run_id} could not be handed on")

    def stranded(self, grace: float, settle: float) -> list[tuple[str, int, bool, int]]:
        """(run, attempt, handed on more than `grace` ago) of every run the workers own that
        has not ended, that no live lease covers (none, expired, or held by a process of this
        host that is gone), and that was handed on more than `settle` seconds ago (a submit
        commits its run a moment before it enqueues it)."""

        def read(conn: Conn) -> list[tuple[str, int, bool, int]]:
            rows = conn.execute(
                f"SELECT r.run_id, d.attempt, d.handed_at < {NOW} - %s, r.lease_owner,"
                f" r.lease_until > {NOW}, r.status, r.state"
                " FROM keel.runs r JOIN keel.dispatch d ON d.run_id = r.run_id"
                " WHERE r.status IN ('queued', 'running', 'awaiting_approval')"
                f" AND d.handed_at < {NOW} - %s",
                (grace, settle),
            ).fetchall()
            return [
                (str(run_id), int(attempt), bool(old), _progress(state))
                for run_id, attempt, old, owner, live, status, state in rows
                if not (owner and live and holder_alive(owner))
                and (status != "awaiting_approval" or _all_decided(state))
            ]

        return self.store.run_sql(read, "the queued runs could not be read")

    def rescue(self, grace: float, settle: float = 2.0) -> list[str]:
        """Hand on every stranded run (see the module docstring); returns their ids. A run
        whose workflow does not exist waits only `settle` seconds; one whose workflow was
        taken (its worker died before it took the lease), `grace`."""
        found = self.stranded(grace, min(settle, grace))
        if not found:
            return []
        ids = [workflow_id(run_id, attempt) for run_id, attempt, _, _ in found]
        statuses = {
            w.workflow_id: w.status
            for w in self.client().list_workflows(
                workflow_ids=ids, load_input=False, load_output=False
            )
        }
        rescued = []
        for (run_id, attempt, old, progress), wid in zip(found, ids, strict=True):
            status = statuses.get(wid)
            waiting = status in ("ENQUEUED", "DELAYED")
            if waiting or (status is not None and not old):
                continue
            taken = self._rescue_attempt(run_id, attempt, progress)
            if taken is None:  # another process rescued it first
                continue
            new, rescues = taken
            if rescues > MAX_RESCUES:
                self._give_up(run_id, rescues - 1)
                continue
            self.enqueue(run_id, new)
            rescued.append(run_id)
        return rescued

    def _rescue_attempt(self, run_id: str, attempt: int, progress: int) -> tuple[int, int] | None:
        """Bump the attempt (if still `attempt`) and count the rescue: in a row when the run
        has answered no call since the last rescue, else the first of a new row."""

        def write(conn: Conn) -> tuple[int, int] | None:
            row = conn.execute(
                "UPDATE keel.dispatch SET attempt = attempt + 1, handed_at = %s,"
                " rescues = CASE WHEN rescued_progress = %s THEN rescues + 1 ELSE 1 END,"
                " rescued_progress = %s WHERE run_id = %s AND attempt = %s"
                " RETURNING attempt, rescues",
                (time.time(), progress, progress, run_id, attempt),
            ).fetchone()
            return (int(row[0]), int(row[1])) if row else None

        return self.store.run_sql(write, f"run {run_id} could not be handed on")

    def _give_up(self, run_id: str, rescues: int) -> None:
        """Mark a run that keeps getting stranded at one step as failed, with the reason."""

        def write(conn: Conn) -> None:
            row = conn.execute(
                "SELECT state FROM keel.runs WHERE run_id = %s FOR UPDATE", (run_id,)
            ).fetchone()
            if row is None:
                return
            state = RunState.decode(json.loads(row[0]))
            if state.status not in LIVE:
                return
            failure = RescuesExhausted(
                f"the workers rescued this run {rescues} times and it stopped every time before "
                "answering another tool call (its worker died, or the store refused the step); "
                "it is not taken up again: see the workers' logs, fix the cause, and submit "
                "the question again",
                step=state.step,
                details={"rescues": rescues},
            )
            ending = Ending.failed(failure)
            events = [e for e in (ending.event(),) if e is not None]  # its RunFailed
            for event in events:
                event.seq, event.at = state.next_seq, time.time()
                state.next_seq += 1
            state.end(ending)
            insert_events(conn, run_id, events)
            conn.execute(
                "UPDATE keel.runs SET status = 'failed', state = %s, updated_at = %s,"
                " lease_owner = NULL, lease_until = NULL WHERE run_id = %s",
                (json.dumps(state.encode()), time.time(), run_id),
            )

        self.store.run_sql(write, f"run {run_id} could not be marked failed")
