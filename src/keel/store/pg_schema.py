"""The Postgres store's schema: the SQLite schema's meaning (`schema.py`) in Postgres types, in
a schema of its own (`keel`, beside DBOS's `dbos`), created again without harm, and numbered
migrations. The version lives in `keel.schema_version`; a database written by a newer Keel is
refused by name, for reading as for writing.

Differences from SQLite, all of representation only: times are double precision; a `dispatch`
table records which runs the workers own (`keel submit`) and which queue attempt is current.
"""

from __future__ import annotations

from typing import Any

import psycopg

from keel.errors import StoreError
from keel.store.failures import newer_schema

__all__ = ["MIGRATIONS", "SCHEMA", "VERSION", "check_version", "prepare"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS keel.runs (
    run_id TEXT PRIMARY KEY,
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL,
    question TEXT NOT NULL,
    model TEXT NOT NULL,
    status TEXT NOT NULL,
    config TEXT NOT NULL,
    state TEXT NOT NULL,
    lease_owner TEXT,
    lease_until DOUBLE PRECISION,
    conversation_id TEXT
);
CREATE INDEX IF NOT EXISTS runs_by_time ON keel.runs (created_at);
CREATE INDEX IF NOT EXISTS runs_by_conversation ON keel.runs (conversation_id, created_at);
CREATE INDEX IF NOT EXISTS runs_by_status ON keel.runs (status, created_at);
CREATE TABLE IF NOT EXISTS keel.events (
    run_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    type TEXT NOT NULL,
    at DOUBLE PRECISION NOT NULL,
    data TEXT NOT NULL,
    body TEXT,
    PRIMARY KEY (run_id, seq)
);
CREATE TABLE IF NOT EXISTS keel.counters (
    run_id TEXT NOT NULL,
    call_key TEXT NOT NULL,
    count INTEGER NOT NULL,
    resets INTEGER NOT NULL,
    last_digest TEXT,
    world INTEGER NOT NULL DEFAULT 0,
    change_resets INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (run_id, call_key)
);
CREATE TABLE IF NOT EXISTS keel.elisions (
    run_id TEXT NOT NULL,
    call_id TEXT NOT NULL,
    step INTEGER NOT NULL,
    PRIMARY KEY (run_id, call_id)
);
CREATE TABLE IF NOT EXISTS keel.blobs (
    digest TEXT PRIMARY KEY,
    data TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS keel.dispatch (
    run_id TEXT PRIMARY KEY,
    attempt INTEGER NOT NULL,
    handed_at DOUBLE PRECISION NOT NULL,
    rescues INTEGER NOT NULL DEFAULT 0,
    rescued_progress INTEGER NOT NULL DEFAULT -1
);
"""
_CANCELS = (
    "CREATE TABLE IF NOT EXISTS keel.cancels (run_id TEXT PRIMARY KEY,"
    " at DOUBLE PRECISION NOT NULL)"
)
"""Cancel requests (ADR 0066): created on every writable open, without a new version, so a
Keel that does not know the table reads and writes the store as before."""
SCHEMA += _CANCELS + ";\n"
_BY_PARENT = (
    "CREATE INDEX IF NOT EXISTS runs_by_parent ON keel.runs (((config::jsonb ->> 'parent_run')))"
)
"""A run's children (cancelling a tree, waking a waiting parent: ADR 0069) without reading
every run's config; created like `_CANCELS`, without a new version."""
SCHEMA += _BY_PARENT + ";\n"

MIGRATIONS: list[str] = [
    # 1 -> 2: what the `progress` loop policy keeps per key (ADR 0029).
    "ALTER TABLE keel.counters ADD COLUMN IF NOT EXISTS world INTEGER NOT NULL DEFAULT 0;"
    " ALTER TABLE keel.counters ADD COLUMN IF NOT EXISTS change_resets INTEGER NOT NULL"
    " DEFAULT 0;",
    # 2 -> 3: rescues of a run that made no progress in between, so they are bounded.
    "ALTER TABLE keel.dispatch ADD COLUMN IF NOT EXISTS rescues INTEGER NOT NULL DEFAULT 0;"
    " ALTER TABLE keel.dispatch ADD COLUMN IF NOT EXISTS rescued_progress INTEGER NOT NULL"
    " DEFAULT -1;",
    # 3 -> 4: conversations (ADR 0038); every earlier run began a conversation of its own.
    "ALTER TABLE keel.runs ADD COLUMN IF NOT EXISTS conversation_id TEXT;"
    " UPDATE keel.runs SET conversation_id = run_id WHERE conversation_id IS NULL;",
]
"""Statements that bring version N (index N-1) to N+1."""
VERSION = len(MIGRATIONS) + 1
_LOCK = 0x6B65656C  # "keel": one advisory lock serialises every process's schema preparation


def _statements(script: str) -> list[str]:
    return [part.strip() for part in script.split(";") if part.strip()]


def check_version(conn: psycopg.Connection[Any], where: str) -> int:
    """The database's Keel schema version (0: none yet); newer than this Keel: refused."""
    found = conn.execute("SELECT to_regclass('keel.schema_version') IS NOT NULL").fetchone()
    if not found or not found[0]:
        return 0
    row = conn.execute("SELECT max(version) FROM keel.schema_version").fetchone()
    current = int(row[0]) if row and row[0] is not None else 0
    if current > VERSION:
        raise newer_schema(where, current, VERSION)
    return current


def prepare(conn: psycopg.Connection[Any], where: str) -> None:
    """Bring the database, new or old, to the current schema in one transaction; several
    processes may open it at once (the advisory lock orders them). A newer one is untouched."""
    with conn.transaction():
        if check_version(conn, where) == VERSION:
            missing = _missing_unversioned(conn)
            if missing:  # added without a version (ADR 0066, 0069): older Keels agree
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK,))
                for statement in missing:
                    conn.execute(statement)
            return
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK,))
        conn.execute("CREATE SCHEMA IF NOT EXISTS keel")
        conn.execute("CREATE TABLE IF NOT EXISTS keel.schema_version (version INTEGER NOT NULL)")
        current = check_version(conn, where)
        if current == VERSION:
            return
        for migration in MIGRATIONS[max(current, 1) - 1 :] if current else []:
            for statement in _statements(migration):
                conn.execute(statement)
        for statement in _statements(SCHEMA):
            conn.execute(statement)
        conn.execute("DELETE FROM keel.schema_version")
        conn.execute("INSERT INTO keel.schema_version (version) VALUES (%s)", (VERSION,))


_UNVERSIONED = {"keel.cancels": _CANCELS, "keel.runs_by_parent": _BY_PARENT}
"""What a store at the current version may lack, by name: created on a writable open."""


def _missing_unversioned(conn: psycopg.Connection[Any]) -> list[str]:
    missing = []
    for name, statement in _UNVERSIONED.items():
        found = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (name,)).fetchone()
        if not (found and found[0]):
            missing.append(statement)
    return missing


def require_tables(conn: psycopg.Connection[Any], where: str) -> None:
    """For read-only opening: a database without Keel's tables is not a Keel store."""
    check_version(conn, where)
    found = conn.execute("SELECT to_regclass('keel.runs') IS NOT NULL").fetchone()
    if not found or not found[0]:
        raise StoreError(f"the store {where} is not a Keel store (it has no keel.runs table)")
