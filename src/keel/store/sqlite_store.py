"""The embedded run store: per run, an append-only event log and the run state.

The run state is a small row of scalars (status, budgets spent, step, pending approvals), the
identical-call counters (one row per key, upserted only when changed), elision decisions, and
the whole text of results that were shown truncated. A step is saved in one transaction that
writes only what the step added, so a checkpoint costs the same at turn 300 as at turn 3.

One process at a time advances a run: it holds the run's lease, renewed with every checkpoint.
A lease whose holder died (same host: its pid is gone; elsewhere: the lease expired) can be
taken over. `synchronous=NORMAL` with WAL survives a killed process; a power cut may lose the
last commits but never corrupts the file.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sqlite3
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from keel.breaker import KeyCounter
from keel.errors import ConfigError
from keel.errors import LeaseHeld as LeaseHeld  # keel.store re-exports both
from keel.errors import LeaseLost as LeaseLost
from keel.store.worker import Worker

_encoder = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
_dumps = _encoder.encode
HOST = socket.gethostname()


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
    counters: dict[str, KeyCounter] = field(default_factory=dict)
    elisions: list[tuple[str, int]] = field(default_factory=list)
    """(call_id, step) of results newly elided."""
    blobs: list[tuple[str, str]] = field(default_factory=list)
    """(digest, text) of results kept whole because the model saw them truncated."""
    lease: str | None = None
    """The writer's lease: the checkpoint is refused if another process took the run over."""
    lease_ttl: float = 0.0
    release: bool = False
    """Let go of the lease (the run finished or paused)."""


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


def new_lease_owner() -> str:
    return f"{HOST}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _holder_alive(owner: str) -> bool:
    host, _, rest = owner.partition(":")
    pid = rest.partition(":")[0]
    if host != HOST or not pid.isdigit():
        return True  # elsewhere: only the expiry tells
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Store:
    """One SQLite file; all access goes through one worker thread that owns the connection."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            try:
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ConfigError(f"cannot create the folder for {self.path}: {exc}") from exc
        self._worker = Worker(self.path, _write_checkpoints)

    def close(self) -> None:
        self._worker.close()

    async def _write(self, work: Any) -> Any:
        return await asyncio.wrap_future(self._worker.submit(work, write=True))

    def _write_now(self, work: Any) -> Any:
        return self._worker.submit(work, write=True).result()

    def _read(self, work: Any) -> Any:
        return self._worker.submit(work, write=False).result()

    # -- writes ------------------------------------------------------------------------------

    async def create_run(
        self,
        run_id: str,
        question: str,
        model: str,
        config: dict[str, Any],
        state: dict[str, Any],
        *,
        lease: str | None = None,
        lease_ttl: float = 0.0,
    ) -> None:
        now = time.time()
        until = now + lease_ttl if lease else None

        def write(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    run_id,
                    now,
                    now,
                    question,
                    model,
                    "running",
                    _dumps(config),
                    _dumps(state),
                    lease,
                    until,
                ),
            )

        await self._write(write)

    async def save_step(self, checkpoint: Checkpoint) -> None:
        await self._write(checkpoint)

    async def acquire_lease(self, run_id: str, owner: str, ttl: float) -> None:
        """Take the run for this process, or raise LeaseHeld naming the live holder."""

        def write(conn: sqlite3.Connection) -> None:
            row = conn.execute(
                "SELECT lease_owner, lease_until FROM runs WHERE run_id = ?", (run_id,)
            ).fetchone()
            if row is None:
                raise ConfigError(f"no run {run_id} in {self.path}")
            holder, until = row
            now = time.time()
            if holder and holder != owner and until > now and _holder_alive(holder):
                raise LeaseHeld(
                    f"run {run_id} is being advanced by another process ({holder}); its lease "
                    f"runs for {until - now:.0f}s more and is renewed while that process lives"
                )
            conn.execute(
                "UPDATE runs SET lease_owner = ?, lease_until = ? WHERE run_id = ?",
                (owner, now + ttl, run_id),
            )

        await self._write(write)

    async def renew_lease(self, run_id: str, owner: str, ttl: float) -> None:
        def write(conn: sqlite3.Connection) -> None:
            cursor = conn.execute(
                "UPDATE runs SET lease_until = ? WHERE run_id = ? AND lease_owner = ?",
                (time.time() + ttl, run_id, owner),
            )
            if cursor.rowcount != 1:
                raise LeaseLost(f"run {run_id} was taken over by another process")

        await self._write(write)

    def decide(
        self, run_id: str, call_id: str, *, approved: bool, by: str, reason: str | None = None
    ) -> dict[str, Any]:
        """Record a person's decision on a pending call of a paused run; returns the event."""

        def write(conn: sqlite3.Connection) -> dict[str, Any]:
            row = conn.execute("SELECT status, state FROM runs WHERE run_id = ?", (run_id,))
            found = row.fetchone()
            if found is None:
                raise ConfigError(f"no run {run_id} in {self.path}")
            status, state_json = found
            state = json.loads(state_json)
            pending = {p["call_id"]: p for p in state.get("pending", [])}
            if status != "awaiting_approval" or call_id not in pending:
                waiting = ", ".join(pending) or "none"
                raise ConfigError(
                    f"run {run_id} has no call {call_id} awaiting a decision "
                    f"(status {status}; calls waiting: {waiting})"
                )
            seq = conn.execute(
                "SELECT coalesce(max(seq), -1) + 1 FROM events WHERE run_id = ?", (run_id,)
            ).fetchone()[0]
            data = {
                "step": state.get("step"),
                "call_id": call_id,
                "name": pending[call_id]["name"],
                "call_key": pending[call_id]["call_key"],
                "approved": approved,
                "by": by,
                "reason": reason,
            }
            conn.execute(
                "INSERT INTO events (run_id, seq, type, at, data) VALUES (?, ?, ?, ?, ?)",
                (run_id, seq, "approval_decided", time.time(), _dumps(data)),
            )
            state.setdefault("decisions", {})[call_id] = {
                "approved": approved,
                "by": by,
                "reason": reason,
            }
            state["next_seq"] = seq + 1
            conn.execute(
                "UPDATE runs SET state = ?, updated_at = ? WHERE run_id = ?",
                (_dumps(state), time.time(), run_id),
            )
            return data

        result: dict[str, Any] = self._write_now(write)
        return result

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
        """The run's events in order, each with seq, type, at and its data; a tool result's
        `elided` says whether it was elided in the last request sent."""

        def read(conn: sqlite3.Connection) -> tuple[list[Any], set[str]]:
            rows = conn.execute(
                "SELECT seq, type, at, data, body FROM events WHERE run_id = ? ORDER BY seq",
                (run_id,),
            ).fetchall()
            return rows, _elided(conn, run_id)

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

    def elided(self, run_id: str) -> set[str]:
        result: set[str] = self._read(lambda c: _elided(c, run_id))
        return result

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


def _elided(conn: sqlite3.Connection, run_id: str) -> set[str]:
    return {r[0] for r in conn.execute("SELECT call_id FROM elisions WHERE run_id = ?", (run_id,))}


def _write_checkpoints(conn: sqlite3.Connection, cps: list[Checkpoint]) -> None:
    """Every checkpoint of a group, one statement per table."""
    conn.executemany(
        "INSERT INTO events (run_id, seq, type, at, data, body) VALUES (?, ?, ?, ?, ?, ?)",
        [(cp.run_id, e.seq, e.type, e.at, _dumps(e.data), e.body) for cp in cps for e in cp.events],
    )
    conn.executemany(
        "INSERT INTO counters VALUES (?, ?, ?, ?, ?) ON CONFLICT (run_id, call_key) DO UPDATE"
        " SET count = excluded.count, resets = excluded.resets, last_digest = excluded.last_digest",
        [
            (cp.run_id, k, c.count, c.resets, c.last_digest)
            for cp in cps
            for k, c in cp.counters.items()
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
    cursor = conn.executemany(
        "UPDATE runs SET status = ?, state = ?, updated_at = ?, lease_owner = ?, lease_until = ?"
        " WHERE run_id = ? AND lease_owner IS ?",
        [
            (
                cp.status,
                _dumps(cp.state),
                now,
                None if cp.release else cp.lease,
                None if cp.release or cp.lease is None else now + cp.lease_ttl,
                cp.run_id,
                cp.lease,
            )
            for cp in cps
        ],
    )
    if cursor.rowcount != len(cps):
        raise LeaseLost("a run was taken over by another process; its step was not saved")
