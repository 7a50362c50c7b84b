"""The store's schema, created again without harm, and its numbered migrations."""

from __future__ import annotations

import re
import sqlite3

from keel.store.failures import newer_schema

__all__ = ["MIGRATIONS", "SCHEMA", "VERSION", "check_version", "prepare"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    question TEXT NOT NULL,
    model TEXT NOT NULL,
    status TEXT NOT NULL,
    config TEXT NOT NULL,
    state TEXT NOT NULL,
    lease_owner TEXT,
    lease_until REAL,
    conversation_id TEXT
);
CREATE INDEX IF NOT EXISTS runs_by_time ON runs (created_at);
CREATE INDEX IF NOT EXISTS runs_by_conversation ON runs (conversation_id, created_at);
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
    world INTEGER NOT NULL DEFAULT 0,
    change_resets INTEGER NOT NULL DEFAULT 0,
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
CREATE TABLE IF NOT EXISTS cancels (
    run_id TEXT PRIMARY KEY,
    at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS runs_by_parent ON runs (json_extract(config, '$.parent_run'));
"""

MIGRATIONS: list[str] = [
    # 1 -> 2: leases, so one process at a time advances a run.
    "ALTER TABLE runs ADD COLUMN lease_owner TEXT; ALTER TABLE runs ADD COLUMN lease_until REAL;",
    # 2 -> 3: what the `progress` loop policy keeps per key (ADR 0029).
    "ALTER TABLE counters ADD COLUMN world INTEGER NOT NULL DEFAULT 0;"
    " ALTER TABLE counters ADD COLUMN change_resets INTEGER NOT NULL DEFAULT 0;",
    # 3 -> 4: conversations (ADR 0038); every earlier run began a conversation of its own.
    "ALTER TABLE runs ADD COLUMN conversation_id TEXT;"
    " UPDATE runs SET conversation_id = run_id WHERE conversation_id IS NULL;",
]
# The `cancels` table (ADR 0066) and the `runs_by_parent` index (a run's children, ADR 0069) are
# created by SCHEMA on every writable open, without a new version: a Keel that does not know
# them reads and writes such a store as before.
VERSION = len(MIGRATIONS) + 1


def _statements(script: str) -> list[str]:
    return [part.strip() for part in script.split(";") if part.strip()]


_ADD_COLUMN = re.compile(r"ALTER TABLE (\w+) ADD COLUMN (\w+)", re.IGNORECASE)


def _already_there(conn: sqlite3.Connection, statement: str) -> bool:
    """A column a migration adds to a table that is not there yet: SCHEMA creates the table
    whole afterwards (a file of the first schema had only `runs`)."""
    found = _ADD_COLUMN.match(statement)
    if found is None:
        return False
    table, column = found.groups()
    columns = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
    return not columns or column in columns


def check_version(conn: sqlite3.Connection, path: str) -> int:
    """The file's schema version; a newer one than this Keel knows is refused by name, for
    reading as for writing (its meaning may have changed)."""
    current = int(conn.execute("PRAGMA user_version").fetchone()[0])
    if current > VERSION:
        raise newer_schema(path, current, VERSION)
    return current


def prepare(conn: sqlite3.Connection, path: str) -> None:
    """Bring any store file, new or old, to the current schema, in one transaction (several
    processes may open the same file at once). A newer file is left untouched."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        current = check_version(conn, path)
        exists = conn.execute("SELECT count(*) FROM sqlite_master WHERE name = 'runs'").fetchone()
        if exists[0] and current < VERSION:
            for migration in MIGRATIONS[max(current, 1) - 1 :]:
                for statement in _statements(migration):
                    if not _already_there(conn, statement):
                        conn.execute(statement)
        for statement in _statements(SCHEMA):
            conn.execute(statement)
        conn.execute(f"PRAGMA user_version={VERSION}")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
