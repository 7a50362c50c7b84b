"""Reading the store: the queries, as functions of a connection, and the read-only opening that
`keel runs` and `keel show` use, which never writes to the file.

Every query names its columns, so a column added by someone else (or a later Keel that did not
need a new schema version) never shifts what a read returns.

Read-only opening, and why it is correct:
- `mode=ro` first. SQLite then reads the database and its write-ahead log (WAL) but never
  writes the database file; it may create the `-wal`/`-shm` side files beside it when they are
  missing (a reader needs the shared-memory index to read the log), which leaves the database's
  bytes, its modification time and its `user_version` as they were.
- When the folder is read-only and the side files are missing, `mode=ro` cannot open the file.
  Then `immutable=1`, which reads the database file alone with no locking. That is exact here: a
  WAL store without a `-wal` file holds every commit in the database file, and no process can be
  writing to it, since a writer would have to create the `-wal` file in that folder.
- A `-wal` file present but unreadable that way (folder read-only, `-shm` missing) holds commits
  that `immutable=1` would silently miss: refused, saying so.
"""

from __future__ import annotations

import os
import sqlite3
from urllib.parse import quote

from keel.errors import StoreError
from keel.records import Event
from keel.store import schema
from keel.store.protocol import RunRecord, decode_events

__all__ = [
    "RunRecord",
    "blob",
    "connect_read_only",
    "conversation",
    "count_runs",
    "counter_rows",
    "elided",
    "events",
    "list_runs",
    "run",
]


def connect_read_only(path: str) -> sqlite3.Connection:
    """Open an existing store without writing to it (see the module docstring)."""
    if not os.path.exists(path):
        raise StoreError(f"no store at {path}")
    uri = "file:" + quote(os.path.abspath(path))
    try:
        conn = _connect(uri + "?mode=ro")
    except sqlite3.OperationalError as exc:
        if exc.sqlite_errorcode & 0xFF != _CANTOPEN:
            raise
        wal = path + "-wal"
        if os.path.exists(wal) and os.path.getsize(wal) > 0:
            raise StoreError(
                f"the store {path} has commits in {wal} that cannot be read without writing "
                "beside it (its folder is read-only): open it once where the folder is writable"
            ) from None
        conn = _connect(uri + "?immutable=1")
    try:
        schema.check_version(conn, path)
        found = conn.execute("SELECT count(*) FROM sqlite_master WHERE name = 'runs'").fetchone()
        if not found[0]:
            raise StoreError(f"the store {path} is not a Keel store (it has no runs table)")
    except BaseException:
        conn.close()
        raise
    return conn


def _connect(uri: str) -> sqlite3.Connection:
    conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
    try:
        conn.execute("PRAGMA busy_timeout=10000")
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()  # opens the file now
    except BaseException:
        conn.close()
        raise
    return conn


_CANTOPEN = 14

_RUN_SELECT = (
    "SELECT run_id, created_at, updated_at, question, model, status, config, state FROM runs"
)


def run(conn: sqlite3.Connection, run_id: str) -> RunRecord | None:
    rows = conn.execute(_RUN_SELECT + " WHERE run_id = ?", (run_id,)).fetchall()
    return RunRecord.from_row(rows[0]) if rows else None


def list_runs(
    conn: sqlite3.Connection, limit: int, *, status: str | None = None, offset: int = 0
) -> list[RunRecord]:
    """Newest first; `status` keeps only runs with that status, `offset` pages on."""
    where, args = _status_filter(status)
    rows = conn.execute(
        _RUN_SELECT + where + " ORDER BY created_at DESC LIMIT ? OFFSET ?", (*args, limit, offset)
    ).fetchall()
    return [RunRecord.from_row(row) for row in rows]


def conversation(conn: sqlite3.Connection, conversation_id: str) -> list[RunRecord]:
    """The runs of a conversation, oldest first."""
    rows = conn.execute(
        _RUN_SELECT + " WHERE conversation_id = ? ORDER BY created_at, rowid", (conversation_id,)
    ).fetchall()
    return [RunRecord.from_row(row) for row in rows]


def count_runs(conn: sqlite3.Connection, status: str | None = None) -> int:
    where, args = _status_filter(status)
    return int(conn.execute("SELECT count(*) FROM runs" + where, args).fetchone()[0])


def _status_filter(status: str | None) -> tuple[str, tuple[str, ...]]:
    return ("", ()) if status is None else (" WHERE status = ?", (status,))


def events(conn: sqlite3.Connection, run_id: str, after: int = -1) -> list[Event]:
    """The run's events in order (those after seq `after`); a tool result's `elided` says
    whether it was elided in the last request sent."""
    rows = conn.execute(
        "SELECT seq, type, at, data, body FROM events WHERE run_id = ? AND seq > ? ORDER BY seq",
        (run_id, after),
    ).fetchall()
    return decode_events(rows, elided(conn, run_id))


def counter_rows(
    conn: sqlite3.Connection, run_id: str
) -> list[tuple[str, int, int, str | None, int, int]]:
    return conn.execute(
        "SELECT call_key, count, resets, last_digest, world, change_resets FROM counters"
        " WHERE run_id = ?",
        (run_id,),
    ).fetchall()


def elided(conn: sqlite3.Connection, run_id: str) -> set[str]:
    return {r[0] for r in conn.execute("SELECT call_id FROM elisions WHERE run_id = ?", (run_id,))}


def blob(conn: sqlite3.Connection, digest: str) -> str | None:
    rows = conn.execute("SELECT data FROM blobs WHERE digest = ?", (digest,)).fetchall()
    return str(rows[0][0]) if rows else None
