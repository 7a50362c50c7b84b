"""The store's worker thread: a cancelled caller never loses a write it handed over, and
nothing a job does (failing, or being cancelled) kills the thread."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path

from keel.records import RunConfig, RunStarted, RunState
from keel.store import Checkpoint, Store

OWNER = "host:1:me"


async def started(store: Store, run_id: str = "run_1") -> None:
    await store.create_run(
        run_id, "q", "m", RunConfig("m", "sys"), RunState(), lease=OWNER, lease_ttl=60
    )


def step(run_id: str, seq: int) -> Checkpoint:
    state = RunState(step=seq + 1, next_seq=seq + 1)
    event = RunStarted(step=seq, seq=seq, at=1.0, question="q", model="m")
    return Checkpoint(run_id, state, events=[event], lease=OWNER, lease_ttl=60)


async def test_a_write_whose_caller_was_cancelled_is_written_whole_and_the_worker_lives(
    tmp_path: Path,
) -> None:
    store = Store(tmp_path / "runs.sqlite")
    await started(store)
    running, release = threading.Event(), threading.Event()

    def slow(conn: sqlite3.Connection) -> None:
        running.set()
        release.wait(5)

    blocker = store._worker.submit(slow, write=True)
    assert running.wait(5)
    save = asyncio.ensure_future(store.save_step(step("run_1", 0)))
    await asyncio.sleep(0.05)  # the write is queued behind the slow job
    save.cancel()
    await asyncio.sleep(0)
    assert save.cancelled()
    release.set()
    blocker.result(timeout=5)

    # The worker still serves requests, and the cancelled write landed whole.
    probe = store._worker.submit(lambda c: c.execute("SELECT 1").fetchone(), write=False)
    assert probe.result(timeout=5) == (1,)
    assert [e.seq for e in store.events("run_1")] == [0]
    record = store.get_run("run_1")
    assert record is not None and record.state.step == 1
    store.close()


async def test_a_failing_job_leaves_the_worker_serving(tmp_path: Path) -> None:
    store = Store(tmp_path / "runs.sqlite")

    def broken(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO nowhere VALUES (1)")

    failed = store._worker.submit(broken, write=True)
    assert isinstance(failed.exception(timeout=5), sqlite3.Error)
    await started(store)
    assert store.get_run("run_1") is not None
    store.close()
