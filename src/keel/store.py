"""The embedded run store: SQLite in WAL mode, driven from one worker thread.

Per run it keeps an append-only event log and the run state: a small row of scalars (status,
budgets spent, step), the identical-call counters (one row per key, upserted only when changed),
elision decisions, and the whole text of results that were shown truncated. A step is saved in
one transaction that writes only what the step added, so a checkpoint costs the same at turn 300
as at turn 3. Several steps waiting at once (many concurrent runs) share one commit.

`synchronous=NORMAL` with WAL survives a killed process (the case Keel guards against); a power
cut may lose the last commits, never corrupt the file.
"""

from __future__ import annotations

import asyncio
import json
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
class _Job:
    fn: Callable[[sqlite3.Connection], Any]
    write: bool
    future: Future[Any]


def _run_one(conn: sqlite3.Connection, job: _Job) -> None:
    try:
        if job.write:
            conn.execute("BEGIN IMMEDIATE")
        result = job.fn(conn)
        if job.write:
            conn.execute("COMMIT")
    except Exception as exc:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        job.future.set_exception(exc)
    else:
        job.future.set_result(result)


@dataclass(slots=True)
class Checkpoint:
    """What one step adds to the store; saved in one transaction."""

    run_id: str
    status: str
    state: dict[str, Any]
    events: list[tuple[int, str, float, dict[str, Any]]] = field(default_factory=list)
    """(seq, type, time, data) of the step's new events."""
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
        self._thread = threading.Thread(target=self._work, name="keel-store", daemon=True)
        self._thread.start()
        self._ready.result()

    # -- the worker thread -------------------------------------------------------------------

    def _work(self) -> None:
        try:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA busy_timeout=10000")
            conn.executescript(_SCHEMA)
            conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
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
            if len(writes) > 1:
                self._group_commit(conn, writes)
            elif writes:
                _run_one(conn, writes[0])
            for read in (j for j in batch if not j.write):
                _run_one(conn, read)
        conn.close()

    @staticmethod
    def _group_commit(conn: sqlite3.Connection, writes: list[_Job]) -> None:
        """Steps that waited together share one commit; one bad step is then retried alone."""
        try:
            conn.execute("BEGIN IMMEDIATE")
            results = [job.fn(conn) for job in writes]
            conn.execute("COMMIT")
        except Exception:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            for job in writes:
                _run_one(conn, job)
        else:
            for job, result in zip(writes, results, strict=True):
                job.future.set_result(result)

    def _submit(self, fn: Callable[[sqlite3.Connection], Any], *, write: bool) -> Future[Any]:
        if not self._thread.is_alive():
            raise RuntimeError("the store is closed")
        job = _Job(fn, write, Future())
        self._jobs.put(job)
        return job.future

    async def _write(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        return await asyncio.wrap_future(self._submit(fn, write=True))

    def _read(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        return self._submit(fn, write=False).result()

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
        def write(conn: sqlite3.Connection) -> None:
            _write_checkpoint(conn, checkpoint)

        await self._write(write)

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
                "SELECT seq, type, at, data FROM events WHERE run_id = ? ORDER BY seq", (run_id,)
            ).fetchall()
            elided = {
                r[0]
                for r in conn.execute("SELECT call_id FROM elisions WHERE run_id = ?", (run_id,))
            }
            return rows, elided

        rows, elided = self._read(read)
        events = []
        for seq, type_, at, data in rows:
            event = {"seq": seq, "type": type_, "at": at, **json.loads(data)}
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


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _write_checkpoint(conn: sqlite3.Connection, cp: Checkpoint) -> None:
    conn.executemany(
        "INSERT INTO events (run_id, seq, type, at, data) VALUES (?, ?, ?, ?, ?)",
        [(cp.run_id, seq, type_, at, _dumps(data)) for seq, type_, at, data in cp.events],
    )
    if cp.counters:
        conn.executemany(
            "INSERT INTO counters VALUES (?, ?, ?, ?, ?) ON CONFLICT (run_id, call_key) DO UPDATE"
            " SET count = excluded.count, resets = excluded.resets,"
            " last_digest = excluded.last_digest",
            [(cp.run_id, key, c.count, c.resets, c.last_digest) for key, c in cp.counters.items()],
        )
    if cp.elisions:
        conn.executemany(
            "INSERT OR IGNORE INTO elisions VALUES (?, ?, ?)",
            [(cp.run_id, call_id, step) for call_id, step in cp.elisions],
        )
    if cp.blobs:
        conn.executemany("INSERT OR IGNORE INTO blobs VALUES (?, ?)", cp.blobs)
    conn.execute(
        "UPDATE runs SET status = ?, state = ?, updated_at = ? WHERE run_id = ?",
        (cp.status, _dumps(cp.state), time.time(), cp.run_id),
    )
