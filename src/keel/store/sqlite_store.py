"""The embedded run store: per run, an append-only event log and the run state.

The run state is a small row of scalars (status, budgets spent, step, pending approvals), the
identical-call counters (one row per key, upserted only when changed), elision decisions, and
the whole text of results that were shown truncated. A step is saved in one transaction that
writes only what the step added, so a checkpoint costs the same at turn 300 as at turn 3.

One process at a time advances a run: it holds the run's lease, renewed with every checkpoint.
A lease whose holder died (same host: its pid is gone; elsewhere: the lease expired) can be
taken over. `durability="process"` (WAL, `synchronous=NORMAL`) survives a killed process; a power
cut may lose the last commits but never corrupts the file. `durability="power"` fsyncs each
step's commit, so a power cut loses nothing committed either (`keel/durability.py`).

Every SQLite or file-system failure leaves here as a StoreError naming the file and what was not
saved (`failures.py`); a failed step is rolled back whole, so the run stays at its last saved
step and `keel resume` continues it once the cause is fixed. `Store(path, read_only=True)`
reads without ever writing (`reading.py`).
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from keel.durability import Durability, check_durability
from keel.errors import ConfigError, KeelError, LeaseHeld, LeaseLost
from keel.records import (
    ApprovalDecided,
    Decision,
    Event,
    KeyCounter,
    RunConfig,
    RunState,
    encode_event,
)
from keel.store import reading
from keel.store.cancels import ended_cancelled, is_live, still_open
from keel.store.failures import store_error
from keel.store.protocol import (
    HOST,
    Checkpoint,
    RunRecord,
    decide_pending,
    holder_alive,
    new_lease_owner,
)
from keel.store.worker import Worker

__all__ = ["HOST", "Checkpoint", "RunRecord", "Store", "new_lease_owner"]

_encoder = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
_dumps = _encoder.encode


class Store:
    """A RunStore (`protocol.py`) in one SQLite file; all access goes through one worker
    thread that owns the connection.

    `read_only`: open an existing store for reading only; nothing is ever written to it (no
    schema upgrade either), and the write methods raise ConfigError. `durability`: "process"
    (the default) or "power", see `keel/durability.py`."""

    def __init__(
        self, path: str | Path, *, read_only: bool = False, durability: Durability = "process"
    ) -> None:
        self.path = str(path)
        self.durability = check_durability(durability)
        if self.path != ":memory:" and not read_only:
            try:
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ConfigError(f"cannot create the folder for {self.path}: {exc}") from exc
        self._worker = Worker(
            self.path, _write_checkpoints, read_only=read_only, durability=self.durability
        )

    def close(self) -> None:
        self._worker.close()

    async def _write(
        self, work: Any, doing: str, resume: str | None = None, *, sync: bool = True
    ) -> Any:
        """`sync`: at power durability, this write is on the disk before it returns."""
        try:
            return await self._worker.submit_async(work, write=True, sync=sync)
        except KeelError:  # the store's own refusals (a lease taken over) keep their class
            raise
        except Exception as exc:  # sqlite3's errors, and data it could not take: one class
            raise store_error(self.path, exc, doing, resume=resume) from exc

    def _write_now(self, work: Any, doing: str) -> Any:
        try:
            return self._worker.submit(work, write=True).result()
        except KeelError:
            raise
        except Exception as exc:
            raise store_error(self.path, exc, doing) from exc

    def _read(self, work: Callable[[sqlite3.Connection], Any], doing: str) -> Any:
        try:
            return self._worker.submit(work, write=False).result()
        except (sqlite3.Error, ValueError) as exc:
            raise store_error(self.path, exc, doing) from exc

    # -- writes ------------------------------------------------------------------------------

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
        """Create the run and log its first events (a fork's: with its counters and
        elisions), in one transaction."""
        now = time.time()
        until = now + lease_ttl if lease else None

        def write(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO runs (run_id, created_at, updated_at, question, model, status,"
                " config, state, lease_owner, lease_until, conversation_id)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    run_id,
                    now,
                    now,
                    question,
                    model,
                    "running",
                    _dumps(config.encode()),
                    _dumps(state.encode()),
                    lease,
                    until,
                    config.conversation_id or run_id,
                ),
            )
            _insert_events(conn, run_id, events)
            if counters or elisions:  # a fork's prefix (keel/_run/fork.py)
                prefix = Checkpoint(
                    run_id, state, counters=dict(counters or {}), elisions=list(elisions),
                    lease=lease, lease_ttl=lease_ttl,
                )  # fmt: skip
                _write_checkpoints(conn, [prefix])

        await self._write(write, f"run {run_id} could not be started; nothing of it was saved")

    async def save_step(self, checkpoint: Checkpoint) -> None:
        """Save one step whole, or raise: LeaseLost when another process took the run over,
        StoreError when the store failed (the run then stays at its last saved step)."""
        step, run_id = checkpoint.state.step, checkpoint.run_id
        doing = f"step {step} could not be saved; run {run_id} stays at its last saved step"
        await self._write(checkpoint, doing, resume=run_id)

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
            if holder and holder != owner and until > now and holder_alive(holder):
                raise LeaseHeld(
                    f"run {run_id} is being advanced by another process ({holder}); its lease "
                    f"runs for {until - now:.0f}s more and is renewed while that process lives"
                )
            conn.execute(
                "UPDATE runs SET lease_owner = ?, lease_until = ? WHERE run_id = ?",
                (owner, now + ttl, run_id),
            )

        # Not synced: a take-over lost to a power cut only matters to a process that is gone.
        await self._write(write, f"run {run_id} could not be taken over", run_id, sync=False)

    async def renew_lease(self, run_id: str, owner: str, ttl: float) -> None:
        def write(conn: sqlite3.Connection) -> None:
            cursor = conn.execute(
                "UPDATE runs SET lease_until = ? WHERE run_id = ? AND lease_owner = ?",
                (time.time() + ttl, run_id, owner),
            )
            if cursor.rowcount != 1:
                raise LeaseLost(f"run {run_id} was taken over by another process")

        doing = f"the lease on run {run_id} could not be renewed"
        await self._write(write, doing, run_id, sync=False)

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
        """Record a person's decision on a pending call of a paused run; returns the event.
        Final: the state is read and written in one BEGIN IMMEDIATE transaction (the worker's),
        so of racing deciders, in this process or others, one wins and the others get
        AlreadyDecided (`decide_pending`)."""

        def write(conn: sqlite3.Connection) -> ApprovalDecided:
            row = conn.execute("SELECT status, state FROM runs WHERE run_id = ?", (run_id,))
            found = row.fetchone()
            if found is None:
                raise ConfigError(f"no run {run_id} in {self.path}")

            def next_seq() -> int:
                sql = "SELECT coalesce(max(seq), -1) + 1 FROM events WHERE run_id = ?"
                return int(conn.execute(sql, (run_id,)).fetchone()[0])

            decision = detail or Decision(approved, by, reason)
            event, state = decide_pending(run_id, call_id, found, next_seq, decision, expect_key)
            _insert_events(conn, run_id, [event])
            conn.execute(
                "UPDATE runs SET state = ?, updated_at = ? WHERE run_id = ?",
                (_dumps(state.encode()), time.time(), run_id),
            )
            return event

        result: ApprovalDecided = self._write_now(write, "the decision could not be recorded")
        return result

    def request_cancel(self, run_id: str) -> list[str]:
        """Cancel the run's tree in one BEGIN IMMEDIATE transaction (keel/store/cancels.py)."""

        def write(conn: sqlite3.Connection) -> list[str]:
            if conn.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchone() is None:
                raise ConfigError(f"no run {run_id} in {self.path}")
            now, open_ = time.time(), []
            for rid, status, state, owner, until in conn.execute(_TREE, (run_id,)).fetchall():
                if not still_open(status):
                    continue
                open_.append(rid)
                if is_live(status, owner, until, now):  # its process sees the request
                    conn.execute(
                        "INSERT OR IGNORE INTO cancels (run_id, at) VALUES (?, ?)", (rid, now)
                    )
                    continue

                def next_seq(rid: str = rid) -> int:
                    sql = "SELECT coalesce(max(seq), -1) + 1 FROM events WHERE run_id = ?"
                    return int(conn.execute(sql, (rid,)).fetchone()[0])

                event, ended = ended_cancelled(state, next_seq)
                _insert_events(conn, rid, [event])
                conn.execute(
                    "UPDATE runs SET status = 'cancelled', state = ?, updated_at = ?,"
                    " lease_owner = NULL, lease_until = NULL WHERE run_id = ?",
                    (_dumps(ended.encode()), now, rid),
                )
            return open_

        found: list[str] = self._write_now(write, f"the cancel of run {run_id} was not recorded")
        return found

    def cancel_requested(self, run_id: str, parent_run: str | None = None) -> bool:
        def read(conn: sqlite3.Connection) -> bool:
            for start in (run_id, parent_run):
                if start is not None and conn.execute(_ABOVE, (start,)).fetchone() is not None:
                    return True
            return False

        asked: bool = self._read(read, f"the cancel requests of run {run_id} could not be read")
        return asked

    def forget_cancel(self, run_id: str) -> None:
        def write(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM cancels WHERE run_id = ?", (run_id,))

        self._write_now(write, f"the cancel request of run {run_id} could not be closed")

    # -- reads -------------------------------------------------------------------------------

    def get_run(self, run_id: str) -> RunRecord | None:
        found: RunRecord | None = self._read(
            lambda c: reading.run(c, run_id), f"run {run_id} could not be read"
        )
        return found

    def list_runs(
        self, limit: int = 20, status: str | None = None, offset: int = 0
    ) -> list[RunRecord]:
        """Newest first; `status` keeps only runs with that status, `offset` pages on."""
        found: list[RunRecord] = self._read(
            lambda c: reading.list_runs(c, limit, status=status, offset=offset),
            "the runs could not be listed",
        )
        return found

    def count_runs(self, status: str | None = None) -> int:
        found: int = self._read(
            lambda c: reading.count_runs(c, status), "the runs could not be counted"
        )
        return found

    def conversation(self, conversation_id: str) -> list[RunRecord]:
        runs: list[RunRecord] = self._read(
            lambda c: reading.conversation(c, conversation_id),
            f"conversation {conversation_id} could not be read",
        )
        return runs

    def events(self, run_id: str, after: int = -1) -> list[Event]:
        """The run's events in order (those after seq `after`: what a live view has not seen);
        a tool result's `elided` says whether it was elided in the last request sent."""
        found: list[Event] = self._read(
            lambda c: reading.events(c, run_id, after),
            f"the events of run {run_id} could not be read",
        )
        return found

    def counters(self, run_id: str) -> dict[str, KeyCounter]:
        rows = self._read(
            lambda c: reading.counter_rows(c, run_id), f"run {run_id} could not be read"
        )
        return {row[0]: KeyCounter(*row[1:]) for row in rows}

    def elided(self, run_id: str) -> set[str]:
        found: set[str] = self._read(
            lambda c: reading.elided(c, run_id), f"run {run_id} could not be read"
        )
        return found

    def blob(self, digest: str) -> str | None:
        found: str | None = self._read(
            lambda c: reading.blob(c, digest), f"the result {digest} could not be read"
        )
        return found


_TREE = """
WITH RECURSIVE tree(id) AS (
    SELECT ?
    UNION SELECT r.run_id FROM runs r JOIN tree t ON json_extract(r.config, '$.parent_run') = t.id
)
SELECT r.run_id, r.status, r.state, r.lease_owner, r.lease_until
FROM runs r JOIN tree t ON r.run_id = t.id
"""
"""A run and its descendants: the runs whose `parent_run` leads back to it."""

_ABOVE = """
WITH RECURSIVE up(id) AS (
    SELECT ?
    UNION SELECT json_extract(r.config, '$.parent_run') FROM runs r JOIN up u ON r.run_id = u.id
    WHERE json_extract(r.config, '$.parent_run') IS NOT NULL
)
SELECT 1 FROM cancels c JOIN up u ON c.run_id = u.id LIMIT 1
"""
"""A cancel request of a run or of any run above it."""


def _insert_events(conn: sqlite3.Connection, run_id: str, events: Sequence[Event]) -> None:
    rows = []
    for event in events:
        type_, data, body = encode_event(event)
        rows.append((run_id, event.seq, type_, event.at, _dumps(data), body))
    conn.executemany(
        "INSERT INTO events (run_id, seq, type, at, data, body) VALUES (?, ?, ?, ?, ?, ?)", rows
    )


def _write_checkpoints(conn: sqlite3.Connection, cps: list[Checkpoint]) -> None:
    """Every checkpoint of a group, one statement per table. The lease is checked first (the
    guarded UPDATE of `runs`): a holder whose run was taken over gets LeaseLost before any of
    its events could collide with the new holder's."""
    now = time.time()
    cursor = conn.executemany(
        "UPDATE runs SET status = ?, state = ?, updated_at = ?, lease_owner = ?, lease_until = ?"
        " WHERE run_id = ? AND lease_owner IS ?",
        [
            (
                cp.state.status,
                _dumps(cp.state.encode()),
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
        taken = ", ".join(cp.run_id for cp in cps)
        raise LeaseLost(f"run {taken} was taken over by another process; its step was not saved")
    for cp in cps:
        _insert_events(conn, cp.run_id, cp.events)
    counters = [
        (cp.run_id, k, c.count, c.resets, c.last_digest, c.world, c.change_resets)
        for cp in cps
        for k, c in cp.counters.items()
    ]
    if counters:  # most steps change a counter; few elide or keep whole texts
        conn.executemany(
            "INSERT INTO counters"
            " (run_id, call_key, count, resets, last_digest, world, change_resets)"
            " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (run_id, call_key) DO UPDATE SET"
            " count = excluded.count, resets = excluded.resets, last_digest = excluded.last_digest,"
            " world = excluded.world, change_resets = excluded.change_resets",
            counters,
        )
    elisions = [(cp.run_id, call_id, step) for cp in cps for call_id, step in cp.elisions]
    if elisions:
        conn.executemany(
            "INSERT OR IGNORE INTO elisions (run_id, call_id, step) VALUES (?, ?, ?)", elisions
        )
    blobs = [b for cp in cps for b in cp.blobs]
    if blobs:
        conn.executemany("INSERT OR IGNORE INTO blobs (digest, data) VALUES (?, ?)", blobs)
    for cp in cps:
        if cp.watch:  # a primary-key lookup in a table that is nearly always empty
            marks = ", ".join("?" * len(cp.watch))
            sql = f"SELECT 1 FROM cancels WHERE run_id IN ({marks}) LIMIT 1"
            cp.cancel_found = conn.execute(sql, cp.watch).fetchone() is not None
