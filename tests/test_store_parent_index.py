"""A run's children are found through an index on `parent_run`, not by reading every run's
config: cancelling a tree, waking a waiting parent and counting its open children walk down
from a run on every store, however many runs it holds (ADR 0069)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import psycopg

from keel.store import open_store


def test_children_are_found_by_the_parent_run_index(store_target: str | Path) -> None:
    open_store(store_target).close()
    if isinstance(store_target, Path):
        from keel.store.sqlite_store import _TREE

        with sqlite3.connect(store_target) as conn:
            plan = conn.execute("EXPLAIN QUERY PLAN " + _TREE, ("run_x",)).fetchall()
        assert any("runs_by_parent" in str(row) for row in plan), plan
        return
    from keel.pool.children import _OPEN_CHILDREN
    from keel.store.postgres_store import _TREE as PG_TREE

    with psycopg.connect(store_target) as pg:
        pg.execute("SET enable_seqscan = off")  # a small table: ask whether the index serves
        for query, args in ((PG_TREE, ("run_x",)), (_OPEN_CHILDREN, ("run_x", ["queued"]))):
            plan = pg.execute("EXPLAIN " + query, args).fetchall()  # type: ignore[arg-type]
            assert any("runs_by_parent" in str(row) for row in plan), plan


def test_a_store_opened_before_the_index_gets_it_and_keeps_its_version(
    store_target: str | Path,
) -> None:
    """Created on open with no new schema version, like the cancels table: a store an older
    Keel wrote gets it, and an older Keel still reads a store this one opened."""
    open_store(store_target).close()
    if isinstance(store_target, Path):
        with sqlite3.connect(store_target) as db:
            db.execute("DROP INDEX runs_by_parent")
        open_store(store_target).close()
        with sqlite3.connect(store_target) as db:
            found = db.execute("SELECT name FROM sqlite_master WHERE name = 'runs_by_parent'")
            assert found.fetchone() is not None
            assert db.execute("PRAGMA user_version").fetchone()[0] == 4
        return
    with psycopg.connect(store_target, autocommit=True) as pg:
        pg.execute("DROP INDEX keel.runs_by_parent")
    open_store(store_target).close()
    with psycopg.connect(store_target, autocommit=True) as pg:
        found = pg.execute("SELECT to_regclass('keel.runs_by_parent')").fetchone()
        assert found is not None and found[0] is not None
        assert pg.execute("SELECT version FROM keel.schema_version").fetchone() == (4,)
