"""The Postgres run store, for many machines: the same RunStore as the SQLite file, on psycopg 3.

The same promises as `sqlite_store`: a step is saved in one transaction that writes only what
the step added; the lease is checked first (a guarded UPDATE of `runs`), so a holder whose run
was taken over gets LeaseLost before any of its events could collide with the new holder's.
Leases are timed by the database's clock, never the machines' (they may disagree). A crashed
holder loses its lease when it expires; on its own host, at once (its process id is gone), as
with SQLite: the owner names host and pid, and another host never judges a pid.

Records cross the boundary typed (`records.py` encodes and decodes them); text columns hold the
same JSON as SQLite's. Postgres refuses NUL characters in text, so a tool result or kept text
holding one is stored JSON-escaped, and read back exactly.

The URL's password is never stored, logged or shown: `path` is the redacted URL, and every
error leaves as one line through `pg_connection`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

import psycopg

from keel.errors import ConfigError, KeelError, LeaseHeld, LeaseLost, StoreError
from keel.records import (
    ApprovalDecided,
    Decision,
    Event,
    KeyCounter,
    RunConfig,
    RunState,
    ToolDispatched,
    encode_event,
)
from keel.store import pg_schema
from keel.store.cancels import ended_cancelled, is_live, still_open
from keel.store.pg_connection import Connections, store_error
from keel.store.protocol import Checkpoint, RunRecord, decide_pending, decode_events, holder_alive
from keel.store.urls import redact

__all__ = ["PostgresStore"]

T = TypeVar("T")
Conn = psycopg.Connection[Any]
_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
NOW = "extract(epoch from clock_timestamp())::float8"
_ESCAPED = "\x01json:"  # a text that held NUL is stored as this prefix and its JSON string


class PostgresStore:
    """A RunStore in a Postgres database (`protocol.py`). `read_only`: never write to it."""

    def __init__(self, url: str, *, read_only: bool = False, connections: int = 8) -> None:
        self.path = redact(url)
        self.read_only = read_only
        self._db = Connections(url, self.path, size=connections, read_only=read_only)
        try:
            self._db.run(self._open)
        except BaseException as exc:
            self._db.close()
            if isinstance(exc, psycopg.Error):
                raise self._error(exc, "") from None
            raise

    def _open(self, conn: Conn) -> None:
        if self.read_only:
            pg_schema.require_tables(conn, self.path)
        else:
            pg_schema.prepare(conn, self.path)

    @property
    def url(self) -> str:
        """The URL as given, credentials included: for DBOS's connections, never shown."""
        return self._db.url

    def close(self) -> None:
        self._db.close()

    # -- running work ------------------------------------------------------------------------

    def _error(self, exc: BaseException, doing: str, resume: str | None = None) -> StoreError:
        return store_error(self.path, exc, doing, resume=resume, secret=self._db._secret)

    def _submit(self, work: Callable[[Conn], T], write: bool, pipeline: bool = False) -> Future[T]:
        if write and self.read_only:
            raise ConfigError(f"the store {self.path} was opened read-only")
        return self._db.submit(work, pipeline=pipeline)

    async def _write(
        self,
        work: Callable[[Conn], T],
        doing: str,
        resume: str | None = None,
        pipeline: bool = False,
    ) -> T:
        try:
            return await asyncio.wrap_future(self._submit(work, True, pipeline))
        except KeelError:  # the store's own refusals (a lease taken over) keep their class
            raise
        except Exception as exc:  # psycopg's errors, and data it could not take: one class
            raise self._error(exc, doing, resume) from None

    def _now(self, work: Callable[[Conn], T], doing: str, write: bool = False) -> T:
        try:
            return self._submit(work, write).result()
        except psycopg.Error as exc:
            raise self._error(exc, doing) from None

    def run_sql(self, work: Callable[[Conn], T], doing: str) -> T:
        """Run `work(conn)` in one transaction (for the distributed worker's own tables)."""
        return self._now(work, doing, write=True)

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
        def write(conn: Conn) -> None:
            insert_run(conn, run_id, question, model, config, state, "running", lease, lease_ttl)
            if events:
                insert_events(conn, run_id, events)
            if counters or elisions:  # a fork's prefix (keel/_run/fork.py)
                prefix = Checkpoint(
                    run_id, state, counters=dict(counters or {}), elisions=list(elisions),
                    lease=lease, lease_ttl=lease_ttl,
                )  # fmt: skip
                _write_checkpoint(conn, prefix)

        await self._write(write, f"run {run_id} could not be started; nothing of it was saved")

    async def save_step(self, checkpoint: Checkpoint) -> None:
        step, run_id = checkpoint.state.step, checkpoint.run_id
        doing = f"step {step} could not be saved; run {run_id} stays at its last saved step"
        await self._write(lambda conn: _write_checkpoint(conn, checkpoint), doing, run_id, True)

    async def acquire_lease(self, run_id: str, owner: str, ttl: float) -> None:
        def write(conn: Conn) -> None:
            row = conn.execute(
                f"SELECT lease_owner, lease_until, {NOW} FROM keel.runs WHERE run_id = %s"
                " FOR UPDATE",
                (run_id,),
            ).fetchone()
            if row is None:
                raise ConfigError(f"no run {run_id} in {self.path}")
            holder, until, now = row
            live = until is not None and until > now and holder_alive(holder)
            if holder and holder != owner and live:
                raise LeaseHeld(
                    f"run {run_id} is being advanced by another process ({holder}); its lease "
                    f"runs for {until - now:.0f}s more and is renewed while that process lives"
                )
            conn.execute(
                f"UPDATE keel.runs SET lease_owner = %s, lease_until = {NOW} + %s"
                " WHERE run_id = %s",
                (owner, ttl, run_id),
            )

        await self._write(write, f"run {run_id} could not be taken over", resume=run_id)

    async def renew_lease(self, run_id: str, owner: str, ttl: float) -> None:
        def write(conn: Conn) -> None:
            cursor = conn.execute(
                f"UPDATE keel.runs SET lease_until = {NOW} + %s"
                " WHERE run_id = %s AND lease_owner = %s",
                (ttl, run_id, owner),
            )
            if cursor.rowcount != 1:
                raise LeaseLost(f"run {run_id} was taken over by another process")

        await self._write(write, f"the lease on run {run_id} could not be renewed", run_id)

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
        """Final, as on SQLite: the run's row is locked (FOR UPDATE) while the decision is
        checked and written, so of racing deciders one wins and the others get AlreadyDecided
        (`decide_pending`) once they get the row."""

        def write(conn: Conn) -> ApprovalDecided:
            found = conn.execute(
                "SELECT status, state FROM keel.runs WHERE run_id = %s FOR UPDATE", (run_id,)
            ).fetchone()
            if found is None:
                raise ConfigError(f"no run {run_id} in {self.path}")

            def next_seq() -> int:
                row = conn.execute(
                    "SELECT coalesce(max(seq), -1) + 1 FROM keel.events WHERE run_id = %s",
                    (run_id,),
                ).fetchone()
                return int(row[0]) if row else 0

            decision = detail or Decision(approved, by, reason)
            event, state = decide_pending(run_id, call_id, found, next_seq, decision, expect_key)
            insert_events(conn, run_id, [event])
            conn.execute(
                "UPDATE keel.runs SET state = %s, updated_at = %s WHERE run_id = %s",
                (_dumps(state.encode()), time.time(), run_id),
            )
            return event

        return self._now(write, "the decision could not be recorded", write=True)

    def request_cancel(self, run_id: str) -> list[str]:
        """Cancel the run's tree in one transaction, the tree's rows locked (cancels.py)."""

        def write(conn: Conn) -> list[str]:
            rows = conn.execute(_TREE, (run_id,)).fetchall()
            if not rows:
                raise ConfigError(f"no run {run_id} in {self.path}")
            open_ = []
            for rid, status, state, owner, until, now in rows:
                if not still_open(status):
                    continue
                open_.append(rid)
                if is_live(status, owner, until, now):  # its process sees the request
                    conn.execute(
                        f"INSERT INTO keel.cancels (run_id, at) VALUES (%s, {NOW})"
                        " ON CONFLICT (run_id) DO NOTHING",
                        (rid,),
                    )
                    continue

                def next_seq(rid: str = rid) -> int:
                    row = conn.execute(
                        "SELECT coalesce(max(seq), -1) + 1 FROM keel.events WHERE run_id = %s",
                        (rid,),
                    ).fetchone()
                    return int(row[0]) if row else 0

                event, ended = ended_cancelled(state, next_seq)
                insert_events(conn, rid, [event])
                conn.execute(
                    "UPDATE keel.runs SET status = 'cancelled', state = %s, updated_at = %s,"
                    " lease_owner = NULL, lease_until = NULL WHERE run_id = %s",
                    (_dumps(ended.encode()), time.time(), rid),
                )
            return open_

        return self._now(write, f"the cancel of run {run_id} was not recorded", write=True)

    def cancel_requested(self, run_id: str, parent_run: str | None = None) -> bool:
        def read(conn: Conn) -> bool:
            for start in (run_id, parent_run):
                if start is not None and conn.execute(_ABOVE, (start,)).fetchone() is not None:
                    return True
            return False

        return self._now(read, f"the cancel requests of run {run_id} could not be read")

    def forget_cancel(self, run_id: str) -> None:
        def write(conn: Conn) -> None:
            conn.execute("DELETE FROM keel.cancels WHERE run_id = %s", (run_id,))

        self._now(write, f"the cancel request of run {run_id} could not be closed", write=True)

    # -- reads -------------------------------------------------------------------------------

    def get_run(self, run_id: str) -> RunRecord | None:
        def read(conn: Conn) -> RunRecord | None:
            row = conn.execute(_RUN_SELECT + " WHERE run_id = %s", (run_id,)).fetchone()
            return RunRecord.from_row(row) if row else None

        return self._now(read, f"run {run_id} could not be read")

    def list_runs(
        self, limit: int = 20, status: str | None = None, offset: int = 0
    ) -> list[RunRecord]:
        def read(conn: Conn) -> list[RunRecord]:
            where, args = (" WHERE status = %s", (status,)) if status else ("", ())
            rows = conn.execute(
                _RUN_SELECT + where + " ORDER BY created_at DESC LIMIT %s OFFSET %s",
                (*args, limit, offset),
            ).fetchall()
            return [RunRecord.from_row(row) for row in rows]

        return self._now(read, "the runs could not be listed")

    def conversation(self, conversation_id: str) -> list[RunRecord]:
        def read(conn: Conn) -> list[RunRecord]:
            rows = conn.execute(
                _RUN_SELECT + " WHERE conversation_id = %s ORDER BY created_at, run_id",
                (conversation_id,),
            ).fetchall()
            return [RunRecord.from_row(row) for row in rows]

        return self._now(read, f"conversation {conversation_id} could not be read")

    def count_runs(self, status: str | None = None) -> int:
        def read(conn: Conn) -> int:
            where, args = (" WHERE status = %s", (status,)) if status else ("", ())
            row = conn.execute("SELECT count(*) FROM keel.runs" + where, args).fetchone()
            return int(row[0]) if row else 0

        return self._now(read, "the runs could not be counted")

    def events(self, run_id: str, after: int = -1) -> list[Event]:
        def read(conn: Conn) -> list[Event]:
            rows = conn.execute(
                "SELECT seq, type, at, data, body FROM keel.events"
                " WHERE run_id = %s AND seq > %s ORDER BY seq",
                (run_id, after),
            ).fetchall()
            return decode_events(rows, _elided(conn, run_id), _unescape)

        return self._now(read, f"the events of run {run_id} could not be read")

    def counters(self, run_id: str) -> dict[str, KeyCounter]:
        def read(conn: Conn) -> dict[str, KeyCounter]:
            rows = conn.execute(
                "SELECT call_key, count, resets, last_digest, world, change_resets"
                " FROM keel.counters WHERE run_id = %s",
                (run_id,),
            ).fetchall()
            return {row[0]: KeyCounter(*row[1:]) for row in rows}

        return self._now(read, f"run {run_id} could not be read")

    def elided(self, run_id: str) -> set[str]:
        return self._now(lambda conn: _elided(conn, run_id), f"run {run_id} could not be read")

    def blob(self, digest: str) -> str | None:
        def read(conn: Conn) -> str | None:
            row = conn.execute("SELECT data FROM keel.blobs WHERE digest = %s", (digest,))
            found = row.fetchone()
            return _unescape(found[0]) if found else None

        return self._now(read, f"the result {digest} could not be read")


_RUN_SELECT = (
    "SELECT run_id, created_at, updated_at, question, model, status, config, state FROM keel.runs"
)


def insert_run(
    conn: Conn,
    run_id: str,
    question: str,
    model: str,
    config: RunConfig,
    state: RunState,
    status: str,
    lease: str | None = None,
    lease_ttl: float = 0.0,
) -> None:
    now = time.time()
    conn.execute(
        "INSERT INTO keel.runs (run_id, created_at, updated_at, question, model, status, config,"
        f" state, lease_owner, lease_until, conversation_id) VALUES (%s, %s, %s, %s, %s, %s, %s,"
        f" %s, %s, CASE WHEN %s::text IS NULL THEN NULL ELSE {NOW} + %s END, %s)",
        (
            run_id,
            now,
            now,
            _plain(question),
            _plain(model),
            status,
            _dumps(config.encode()),
            _dumps(state.encode()),
            lease,
            lease,
            lease_ttl,
            _plain(config.conversation_id or run_id),
        ),
    )


def _write_checkpoint(conn: Conn, cp: Checkpoint) -> None:
    """One step: the lease first (the guarded UPDATE), then only what the step added.

    A step's commit waits for the server's WAL flush only when it journals a side effect about
    to run (the one commit whose loss could make an effect run twice). Other steps commit
    asynchronously: like SQLite's synchronous=NORMAL, a killed Keel process loses nothing, and
    a crashed database server loses at most its last moment of steps (never one before an
    effect), never its consistency; they then cost no fsync each (ADR 0026)."""
    released = cp.release or cp.lease is None
    with conn.pipeline():  # BEGIN, the setting and the guarded UPDATE: one round trip
        if not any(isinstance(e, ToolDispatched) for e in cp.events):
            conn.execute("SET LOCAL synchronous_commit = off")
        cursor = conn.execute(
            "UPDATE keel.runs SET status = %s, state = %s, updated_at = %s, lease_owner = %s,"
            f" lease_until = CASE WHEN %s THEN NULL ELSE {NOW} + %s END"
            " WHERE run_id = %s AND lease_owner IS NOT DISTINCT FROM %s",
            (
                cp.state.status,
                _dumps(cp.state.encode()),
                time.time(),
                None if cp.release else cp.lease,
                released,
                cp.lease_ttl,
                cp.run_id,
                cp.lease,
            ),
        )
    if cursor.rowcount != 1:
        raise LeaseLost(
            f"run {cp.run_id} was taken over by another process; its step was not saved"
        )
    with conn.cursor() as cur:
        if cp.events:
            insert_events(conn, cp.run_id, cp.events, cur)
        if cp.counters:
            cur.executemany(
                "INSERT INTO keel.counters"
                " (run_id, call_key, count, resets, last_digest, world, change_resets)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (run_id, call_key) DO UPDATE"
                " SET count = excluded.count, resets = excluded.resets,"
                " last_digest = excluded.last_digest, world = excluded.world,"
                " change_resets = excluded.change_resets",
                [
                    (cp.run_id, k, c.count, c.resets, c.last_digest, c.world, c.change_resets)
                    for k, c in cp.counters.items()
                ],
            )
        if cp.elisions:
            cur.executemany(
                "INSERT INTO keel.elisions (run_id, call_id, step) VALUES (%s, %s, %s)"
                " ON CONFLICT DO NOTHING",
                [(cp.run_id, _plain(call_id), step) for call_id, step in cp.elisions],
            )
        if cp.blobs:
            cur.executemany(
                "INSERT INTO keel.blobs (digest, data) VALUES (%s, %s) ON CONFLICT DO NOTHING",
                [(digest, _escape(text)) for digest, text in cp.blobs],
            )
        if cp.watch:  # a primary-key lookup in a table that is nearly always empty
            found = cur.execute(
                "SELECT 1 FROM keel.cancels WHERE run_id = ANY(%s) LIMIT 1", (list(cp.watch),)
            ).fetchone()
            cp.cancel_found = found is not None


_TREE = f"""
WITH RECURSIVE tree(id) AS (
    SELECT %s::text
    UNION SELECT r.run_id FROM keel.runs r JOIN tree t ON (r.config::jsonb ->> 'parent_run') = t.id
)
SELECT r.run_id, r.status, r.state, r.lease_owner, r.lease_until, {NOW}
FROM keel.runs r JOIN tree t ON r.run_id = t.id
ORDER BY r.run_id
FOR UPDATE OF r
"""
"""A run and its descendants, locked: the runs whose `parent_run` leads back to it."""

_ABOVE = """
WITH RECURSIVE up(id) AS (
    SELECT %s::text
    UNION SELECT (r.config::jsonb ->> 'parent_run') FROM keel.runs r JOIN up u ON r.run_id = u.id
    WHERE (r.config::jsonb ->> 'parent_run') IS NOT NULL
)
SELECT 1 FROM keel.cancels c JOIN up u ON c.run_id = u.id LIMIT 1
"""
"""A cancel request of a run or of any run above it."""


def insert_events(
    conn: Conn, run_id: str, events: Sequence[Event], cur: psycopg.Cursor[Any] | None = None
) -> None:
    rows = []
    for event in events:
        type_, data, body = encode_event(event)
        rows.append((run_id, event.seq, type_, event.at, _dumps(data), _escape(body)))
    (cur or conn.cursor()).executemany(
        "INSERT INTO keel.events (run_id, seq, type, at, data, body)"
        " VALUES (%s, %s, %s, %s, %s, %s)",
        rows,
    )


def _elided(conn: Conn, run_id: str) -> set[str]:
    rows = conn.execute("SELECT call_id FROM keel.elisions WHERE run_id = %s", (run_id,))
    return {r[0] for r in rows.fetchall()}


def _escape(text: str | None) -> str | None:
    """Postgres text cannot hold NUL: such a text is kept as a marked JSON string."""
    if text is None or ("\x00" not in text and not text.startswith(_ESCAPED)):
        return text
    return _ESCAPED + json.dumps(text)


def _unescape(text: str | None) -> str | None:
    if text is None or not text.startswith(_ESCAPED):
        return text
    return str(json.loads(text[len(_ESCAPED) :]))


def _plain(text: str) -> str:
    """A name or question shown as it is, NUL made visible (never an identifier that joins)."""
    return text.replace("\x00", "\ufffd")
