"""The store's worker thread: it owns the SQLite connection, so the event loop never blocks on
disk. Writes that queue up together share one transaction (group commit); if that transaction
fails, each write is tried alone so a bad step fails only its own run. The write-ahead log is
checkpointed and restarted by a thread of its own (`wal.py`), so no commit waits for that.

Durability (`keel/durability.py`): the connection runs `synchronous=NORMAL`; at `power`, a
transaction holding a write that asked for it (a step, a decision, a new run) is committed with
`synchronous=FULL`, which is one fsync of the log. Lease renewals never ask: a lost renewal only
matters to a process that is gone.

A job, once submitted, runs whole even if its caller stops waiting: its future is marked running
at once, so cancelling the awaiting task cannot cancel it (the recorder has already handed its
events over; dropping them would lose them, and half of them cannot be written). Nothing a job
does, and no way its future ends, stops the thread.

The event loop's writes (`submit_async`) wait on a plain asyncio future that the thread settles
through `call_soon_threadsafe`: a `concurrent.futures.Future` chained to an asyncio one costs a
lock, a condition and two callbacks per step on the loop's thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from queue import SimpleQueue
from typing import Any

from keel.durability import Durability
from keel.errors import ConfigError
from keel.store import reading, schema
from keel.store.failures import StoreMoved, store_error
from keel.store.wal import WAL_LIMIT, WalKeeper

__all__ = ["Job", "Worker"]

Work = Callable[[sqlite3.Connection], Any]
GroupWork = Callable[[sqlite3.Connection, list[Any]], None]


@dataclass(frozen=True, slots=True)
class Job:
    work: Work | Any
    """A function of the connection, or a value that `group` writes with its peers at once."""
    write: bool
    future: Future[Any] | asyncio.Future[Any]
    """Settled by the thread: a waiting thread's future, or an event loop's."""
    sync: bool = True
    """At `power` durability, commit it with an fsync (every write but a lease renewal)."""


class Worker:
    """Owns the connection. `read_only` opens the file without ever writing to it (see
    `reading.connect_read_only`): no schema preparation, no pragmas that write, no checkpoint."""

    def __init__(
        self,
        path: str,
        group: GroupWork,
        *,
        read_only: bool = False,
        durability: Durability = "process",
        wal_limit: int = WAL_LIMIT,
    ) -> None:
        self.path = path
        self.read_only = read_only
        self.durability: Durability = durability
        self.commits = 0
        """Transactions committed so far (the WAL keeper compares it across a checkpoint)."""
        self.gate = threading.Lock()
        """Held around every batch of jobs; the WAL keeper takes it to restart the log."""
        self.wal_limit = wal_limit
        self._group = group
        self._jobs: SimpleQueue[Job | None] = SimpleQueue()
        self._ready: Future[None] = Future()
        self._identity: tuple[int, int] | None = None
        self._full = False
        """The connection commits with synchronous=FULL now."""
        memory = path == ":memory:"
        self.wal: WalKeeper | None = None
        if not (memory or read_only):
            self.wal = WalKeeper(path, self.connect, self.gate, lambda: self.commits, wal_limit)
        self._thread = threading.Thread(target=self._work, name="keel-store", daemon=True)
        self._thread.start()
        self._ready.result()

    @property
    def native_id(self) -> int | None:
        """The thread's id as the operating system knows it (for counting its fsyncs)."""
        return self._thread.native_id

    def connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA busy_timeout=10000")
        return conn

    def submit(self, work: Work | Any, *, write: bool, sync: bool = True) -> Future[Any]:
        future: Future[Any] = Future()
        future.set_running_or_notify_cancel()  # from here on, cancel() cannot drop it
        self._put(Job(work, write, future, sync))
        return future

    def submit_async(self, work: Work | Any, *, write: bool, sync: bool = True) -> Awaitable[Any]:
        """`submit` for the running event loop. Cancelling the awaiting task cancels the wait,
        never the job."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._put(Job(work, write, future, sync))
        return future

    def _put(self, job: Job) -> None:
        if not self._thread.is_alive():
            raise RuntimeError("the store is closed")
        if job.write and self.read_only:
            raise ConfigError(f"the store {self.path} was opened read-only")
        self._jobs.put(job)

    def close(self) -> None:
        if self._thread.is_alive():
            self._jobs.put(None)
            self._thread.join()

    def _open(self) -> sqlite3.Connection:
        if self.read_only:
            return reading.connect_read_only(self.path)
        conn = self.connect()
        try:
            schema.check_version(conn, self.path)  # before anything that could write
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            schema.prepare(conn, self.path)
            if self.wal is not None:
                conn.execute("PRAGMA wal_autocheckpoint=0")
                conn.execute(f"PRAGMA journal_size_limit={self.wal_limit}")
            if self.path != ":memory:":
                self._identity = _identity(self.path)
        except BaseException:
            conn.close()
            raise
        return conn

    def _work(self) -> None:
        try:
            conn = self._open()
        except Exception as exc:
            if self.wal is not None:
                self.wal.stop()
            self._ready.set_exception(store_error(self.path, exc))
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
            try:
                with self.gate:
                    self._serve(conn, batch)
            except Exception as exc:  # a bug in the worker itself: fail the batch, not the thread
                for one in batch:
                    _settle(one.future, error=exc)
            if self.wal is not None and any(one.write for one in batch):
                self.wal.after_commit()
        if self.wal is not None:
            self.wal.stop()
            with contextlib.suppress(sqlite3.Error):  # if not now, the next open replays it
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()

    def _serve(self, conn: sqlite3.Connection, batch: list[Job]) -> None:
        writes = [j for j in batch if j.write]
        if writes:
            self._commit(conn, writes)
        for read in (j for j in batch if not j.write):
            self._run(conn, [read], transaction=False)

    def _commit(self, conn: sqlite3.Connection, jobs: list[Job]) -> None:
        full = self.durability == "power" and any(job.sync for job in jobs)
        if full != self._full:
            conn.execute(f"PRAGMA synchronous={'FULL' if full else 'NORMAL'}")
            self._full = full
        if len(jobs) > 1 and self._run(conn, jobs, transaction=True, settle_errors=False):
            return
        for job in jobs:
            self._run(conn, [job], transaction=True)

    def _run(
        self,
        conn: sqlite3.Connection,
        jobs: list[Job],
        *,
        transaction: bool,
        settle_errors: bool = True,
    ) -> bool:
        """Run jobs (in one transaction when asked) and settle their futures; on failure roll
        back and return False, leaving the futures unsettled when `settle_errors` is off."""
        try:
            if transaction:
                conn.execute("BEGIN IMMEDIATE")
            grouped = [j.work for j in jobs if not callable(j.work)]
            results = {id(j): j.work(conn) for j in jobs if callable(j.work)}
            if grouped:
                self._group(conn, grouped)
            if transaction:
                self._check_identity()
                conn.execute("COMMIT")
                self.commits += 1
        except Exception as exc:
            _roll_back(conn)
            if settle_errors:
                for job in jobs:
                    _settle(job.future, error=exc)
            return False
        for job in jobs:
            _settle(job.future, result=results.get(id(job)))
        return True

    def _check_identity(self) -> None:
        """Refuse to commit into a file that is no longer at the store's path: SQLite would
        go on writing to the deleted (or replaced) inode, and the run would end with nothing
        saved, silently. One stat() per commit."""
        if self._identity is None:
            return
        try:
            now = _identity(self.path)
        except OSError as exc:
            raise StoreMoved(str(exc)) from exc
        if now != self._identity:
            raise StoreMoved(f"{self.path} is another file now")


def _identity(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def _roll_back(conn: sqlite3.Connection) -> None:
    """Undo a failed transaction; SQLite may have rolled it back already (a full disk, an I/O
    error), and a rollback that fails leaves nothing more to undo."""
    with contextlib.suppress(sqlite3.Error):
        if conn.in_transaction:
            conn.execute("ROLLBACK")


def _settle(
    future: Future[Any] | asyncio.Future[Any],
    *,
    result: Any = None,
    error: BaseException | None = None,
) -> None:
    """End a job's future; one that already ended (it cannot be cancelled, see `submit`) is
    left as it is, never allowed to raise in the worker thread. An event loop's future is ended
    on its loop; a loop that has closed meanwhile has nobody waiting any more."""
    if isinstance(future, asyncio.Future):
        with contextlib.suppress(RuntimeError):
            future.get_loop().call_soon_threadsafe(_resolve, future, result, error)
        return
    with contextlib.suppress(InvalidStateError):
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)


def _resolve(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    """On the loop: a wait that was cancelled stays cancelled (the job ran all the same)."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
