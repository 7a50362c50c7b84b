"""The embedded run store: SQLite in WAL mode, driven from one worker thread.

Per run it keeps an append-only event log and the run state: a small row of scalars (status,
budgets spent, step), the identical-call counters (one row per key, upserted only when changed),
elision decisions, and the whole text of results that were shown truncated. A step is saved in
one transaction that writes only what the step added, so a checkpoint costs the same at turn 300
as at turn 3. Several steps waiting at once (many concurrent runs) share one commit.

`synchronous=NORMAL` with WAL survives a killed process (the case Keel guards against); a power
cut may lose the last commits, never corrupt the file. WAL checkpoints (copying the log back
into the database) run on a thread of their own, so no step waits for one.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from queue import SimpleQueue
from typing import Any

from keel.breaker import KeyCounter
from keel.errors import ConfigError

SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    question TEXT NOT NULL,
    model TEXT NOT NULL,
    status TEXT NOT NULL,
    config TEXT NOT NULL,
    state TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS runs_by_time ON runs (created_at);
CREATE TABLE IF NOT EXISTS events (
    run_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    type TEXT NOT NULL,
    at REAL NOT NULL,
    data TEXT NOT NULL,
    body TEXT,
    PRIMARY KEY (run_id, seq)
);
CREATE TABLE IF NOT EXISTS counters (
    run_id TEXT NOT NULL,
    call_key TEXT NOT NULL,
    count INTEGER NOT NULL,
    resets INTEGER NOT NULL,
    last_digest TEXT,
    PRIMARY KEY (run_id, call_key)
);
CREATE TABLE IF NOT EXISTS elisions (
    run_id TEXT NOT NULL,
    call_id TEXT NOT NULL,
    step INTEGER NOT NULL,
    PRIMARY KEY (run_id, call_id)
);
CREATE TABLE IF NOT EXISTS blobs (
    digest TEXT PRIMARY KEY,
    data TEXT NOT NULL
);
"""


@dataclass(frozen=True, slots=True)
class Event:
    seq: int
    type: str
    at: float
    data: dict[str, Any]
    body: str | None = None
    """A large text (a tool result) kept out of the JSON of `data`: cheaper to write."""


@dataclass(slots=True)
class Checkpoint:
    """What one step adds to the store; saved in one transaction."""

    run_id: str
    status: str
    state: dict[str, Any]
    events: list[Event] = field(default_factory=list)
    """The step's new events."""
    counters: dict[str, KeyCounter] = field(default_factory=dict)
    elisions: list[tuple[str, int]] = field(default_factory=list)
    """(call_id, step) of results newly elided."""
    blobs: list[tuple[str, str]] = field(default_factory=list)
    """(digest, text) of results kept whole because the model saw them truncated."""


@dataclass(frozen=True, slots=True)
class RunRecord:
    run_id: str
    created_at: float
    updated_at: float
    question: str
    model: str
    status: str
    config: dict[str, Any]
    state: dict[str, Any]


class Store:
    """One SQLite file. All access goes through a single worker thread that owns the connection."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            try:
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ConfigError(
                    f"cannot create the store's folder for {self.path}: {exc}"
                ) from exc
        self._jobs: SimpleQueue[_Job | None] = SimpleQueue()
        self._ready: Future[None] = Future()
        self._checkpointer = None if self.path == ":memory:" else _Checkpointer(self)
        self._thread = threading.Thread(target=self._work, name="keel-store", daemon=True)
        self._thread.start()
        self._ready.result()

    # -- the worker thread -------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA busy_timeout=10000")
        return conn

    def _work(self) -> None:
        try:
            conn = self._connect()
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.executescript(_SCHEMA)
            conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            if self._checkpointer is not None:
                conn.execute("PRAGMA wal_autocheckpoint=0")
        except sqlite3.Error as exc:
            self._ready.set_exception(ConfigError(f"cannot open the store {self.path}: {exc}"))
            return
        self._ready.set_result(None)
        while (job := self._jobs.get()) is not None:
            batch = [job]
            while not self._jobs.empty():
                more = self._jobs.get()
                if more is None:
                    self._jobs.put(None)
                    break
                batch.append(more)
            writes = [j for j in batch if j.write]
            if writes:
                _commit(conn, writes)
                if self._checkpointer is not None:
                    self._checkpointer.nudge()
            for read in (j for j in batch if not j.write):
                _run(conn, [read], transaction=False)
        if self._checkpointer is not None:
            self._checkpointer.stop()
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()

    def _submit(self, job: _Job) -> Future[Any]:
        if not self._thread.is_alive():
            raise RuntimeError("the store is closed")
        self._jobs.put(job)
        return job.future

    async def _write(self, work: Callable[[sqlite3.Connection], Any] | Checkpoint) -> Any:
        return await asyncio.wrap_future(self._submit(_Job(work, True, Future())))

    def _read(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        return self._submit(_Job(fn, False, Future())).result()

    def close(self) -> None:
        if self._thread.is_alive():
            self._jobs.put(None)
            self._thread.join()

    # -- writes ------------------------------------------------------------------------------

    async def create_run(
        self, run_id: str, question: str, model: str, config: dict[str, Any], state: dict[str, Any]
    ) -> None:
        now = time.time()

        def write(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (run_id, now, now, question, model, "running", _dumps(config), _dumps(state)),
            )

        await self._write(write)

    async def save_step(self, checkpoint: Checkpoint) -> None:
        await self._write(checkpoint)

    # -- reads -------------------------------------------------------------------------------

    def get_run(self, run_id: str) -> RunRecord | None:
        rows = self._read(
            lambda c: c.execute(_RUN_SELECT + " WHERE run_id = ?", (run_id,)).fetchall()
        )
        return _record(rows[0]) if rows else None

    def list_runs(self, limit: int = 20) -> list[RunRecord]:
        rows = self._read(
            lambda c: c.execute(
                _RUN_SELECT + " ORDER BY created_at DESC LIMIT ?", (limit,)
            ).fetchall()
        )
        return [_record(row) for row in rows]

    def events(self, run_id: str) -> list[dict[str, Any]]:
        """The run's events in order, each with seq, type, at and its data; elided as last sent."""

        def read(conn: sqlite3.Connection) -> tuple[list[Any], set[str]]:
            rows = conn.execute(
                "SELECT seq, type, at, data, body FROM events WHERE run_id = ? ORDER BY seq",
                (run_id,),
            ).fetchall()
            elided = {
                r[0]
                for r in conn.execute("SELECT call_id FROM elisions WHERE run_id = ?", (run_id,))
            }
            return rows, elided

        rows, elided = self._read(read)
        events = []
        for seq, type_, at, data, body in rows:
            event = {"seq": seq, "type": type_, "at": at, **json.loads(data)}
            if body is not None:
                event["content"] = body
            if type_ == "tool_result":
                event["elided"] = event.get("call_id") in elided
            events.append(event)
        return events

    def counters(self, run_id: str) -> dict[str, KeyCounter]:
        rows = self._read(
            lambda c: c.execute(
                "SELECT call_key, count, resets, last_digest FROM counters WHERE run_id = ?",
                (run_id,),
            ).fetchall()
        )
        return {key: KeyCounter(count, resets, digest) for key, count, resets, digest in rows}

    def blob(self, digest: str) -> str | None:
        rows = self._read(
            lambda c: c.execute("SELECT data FROM blobs WHERE digest = ?", (digest,)).fetchall()
        )
        return str(rows[0][0]) if rows else None


_RUN_SELECT = (
    "SELECT run_id, created_at, updated_at, question, model, status, config, state FROM runs"
)


def _record(row: Sequence[Any]) -> RunRecord:
    run_id, created, updated, question, model, status, config, state = row
    return RunRecord(
        run_id, created, updated, question, model, status, json.loads(config), json.loads(state)
    )


_encoder = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
_dumps = _encoder.encode


@dataclass(frozen=True, slots=True)
class _Job:
    work: Callable[[sqlite3.Connection], Any] | Checkpoint
    write: bool
    future: Future[Any]


def _commit(conn: sqlite3.Connection, jobs: list[_Job]) -> None:
    """Writes that queued together share one transaction; if it fails, each is tried alone so
    a bad step fails only its own run."""
    if len(jobs) > 1 and _run(conn, jobs, transaction=True, settle_errors=False):
        return
    for job in jobs:
        _run(conn, [job], transaction=True)


def _run(
    conn: sqlite3.Connection, jobs: list[_Job], *, transaction: bool, settle_errors: bool = True
) -> bool:
    """Run jobs (in one transaction when asked); settle their futures. False if it failed and
    the futures were left for the caller."""
    try:
        if transaction:
            conn.execute("BEGIN IMMEDIATE")
        checkpoints = [j.work for j in jobs if isinstance(j.work, Checkpoint)]
        results = {id(j): j.work(conn) for j in jobs if not isinstance(j.work, Checkpoint)}
        if checkpoints:
            _write_checkpoints(conn, checkpoints)
        if transaction:
            conn.execute("COMMIT")
    except Exception as exc:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        if not settle_errors:
            return False
        for job in jobs:
            job.future.set_exception(exc)
        return False
    for job in jobs:
        job.future.set_result(results.get(id(job)))
    return True


def _write_checkpoints(conn: sqlite3.Connection, cps: list[Checkpoint]) -> None:
    """Every checkpoint of a group in one statement per table."""
    conn.executemany(
        "INSERT INTO events (run_id, seq, type, at, data, body) VALUES (?, ?, ?, ?, ?, ?)",
        [(cp.run_id, e.seq, e.type, e.at, _dumps(e.data), e.body) for cp in cps for e in cp.events],
    )
    conn.executemany(
        "INSERT INTO counters VALUES (?, ?, ?, ?, ?) ON CONFLICT (run_id, call_key) DO UPDATE"
        " SET count = excluded.count, resets = excluded.resets, last_digest = excluded.last_digest",
        [
            (cp.run_id, key, c.count, c.resets, c.last_digest)
            for cp in cps
            for key, c in cp.counters.items()
        ],
    )
    conn.executemany(
        "INSERT OR IGNORE INTO elisions VALUES (?, ?, ?)",
        [(cp.run_id, call_id, step) for cp in cps for call_id, step in cp.elisions],
    )
    conn.executemany(
        "INSERT OR IGNORE INTO blobs VALUES (?, ?)", [b for cp in cps for b in cp.blobs]
    )
    now = time.time()
    conn.executemany(
        "UPDATE runs SET status = ?, state = ?, updated_at = ? WHERE run_id = ?",
        [(cp.status, _dumps(cp.state), now, cp.run_id) for cp in cps],
    )


class _Checkpointer:
    """Copies the WAL back into the database from its own connection and thread, when the log
    has grown, so commits never stall on it. PASSIVE: it never blocks the writer or readers."""

    WAL_LIMIT = 4 * 1024 * 1024

    def __init__(self, store: Store) -> None:
        self.wal = store.path + "-wal"
        self.store = store
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._work, name="keel-wal", daemon=True)
        self._thread.start()

    def nudge(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        self._thread.join()

    def _work(self) -> None:
        conn: sqlite3.Connection | None = None
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._stopping:
                break
            try:
                if os.path.getsize(self.wal) < self.WAL_LIMIT:
                    continue
                conn = conn or self.store._connect()
                conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
            except (OSError, sqlite3.Error):
                continue  # the writer's TRUNCATE on close still brings the log home
        if conn is not None:
            conn.close()
