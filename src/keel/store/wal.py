"""The write-ahead log's upkeep: checkpoints when the log has grown, and restarting the log, on
a thread of its own, so that a step's commit never pays a checkpoint's fsyncs and, unless the
disk falls behind, never waits for one.

In WAL mode each commit appends to the `-wal` file. A checkpoint copies the log back into the
database (an fsync of the log, one of the database); only once every frame is copied can the
log start again from its beginning. SQLite's own automatic checkpoint runs inside whichever
commit crosses its threshold, so Keel turns it off (`wal_autocheckpoint=0`) and does this:

- **Trigger on growth, not on size.** A checkpoint starts when the log has grown by `limit`
  bytes since the last one. The file never shrinks on its own, so a trigger on its size fires
  again on every commit once the size is reached (issue 12 counted 2.4 fsyncs per step that
  way). With `journal_size_limit = limit` SQLite cuts the file back to `limit` whenever the log
  restarts, so "the file is larger than `limit`" means "the log grew past `limit` this round";
  the writer checks that with one stat() after each commit, and wakes this thread only then.
- **Restart here, not in a step's commit.** The first commit into a restarted log syncs the
  log's header first (an fsync more; SQLite ticket ff5be73dee), in whichever commit comes first.
  So the keeper writes that first commit itself: a write of nothing (`user_version` set to its
  own value), while holding the writer's gate so that no step can commit in between. Frames
  committed during the copy, or left by it because a step's commit still held its read mark
  when the copy began, are copied under the gate first. A step that wants to commit just then
  waits for that short tail (once per `limit` of log), never for the bulk of a checkpoint.
- **Back-pressure, only when the disk falls behind.** If the writer outruns a checkpoint by a
  whole `limit` (the log reaches twice the mark that started it), the writer waits for that
  checkpoint to finish before its next commit. On a machine that keeps up this never happens;
  on one that does not, it is what keeps the log bounded.
- **Readers decide when the log can restart.** A reader still using old frames (`keel show`,
  another process) can keep a checkpoint from finishing or the log from restarting; the next try
  then waits for another `limit` of growth, so a slow reader costs one checkpoint per `limit`,
  not one per commit, and the log stays bounded once readers let go.

The gate works within one process. Processes sharing a store each keep the log this way; a
commit of one of them may then be the first into a log another restarted (one header sync
more, now and then). Closing the store truncates the log (see `worker.py`).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Callable

__all__ = ["WAL_LIMIT", "WalKeeper"]

WAL_LIMIT = 4 * 1024 * 1024
"""Bytes of log growth that start a checkpoint, and the size the log's file is cut back to."""


class WalKeeper:
    """Checkpoints and restarts the log of the store at `path` from its own connection.

    `gate` is held by the writer around every transaction; `commits` reads the writer's count of
    committed transactions (both in `worker.py`)."""

    def __init__(
        self,
        path: str,
        connect: Callable[[], sqlite3.Connection],
        gate: threading.Lock,
        commits: Callable[[], int],
        limit: int = WAL_LIMIT,
    ) -> None:
        self.wal = path + "-wal"
        self.limit = limit
        self.checkpoints = 0
        """Checkpoints run, for tests and benchmarks."""
        self.restarts = 0
        """Times the log was restarted here."""
        self._connect = connect
        self._gate = gate
        self._commits = commits
        self._next_at = limit + 1
        self._wake = threading.Event()
        self._idle = threading.Event()
        """Set while no checkpoint is running."""
        self._idle.set()
        self._stopping = False
        self._thread = threading.Thread(target=self._work, name="keel-wal", daemon=True)
        self._thread.start()

    @property
    def native_id(self) -> int | None:
        """The thread's id as the operating system knows it (for counting its fsyncs)."""
        return self._thread.native_id

    def after_commit(self) -> None:
        """Called by the writer after each commit (outside its gate): one stat(), a wake-up
        when the log has grown by `limit` since the last checkpoint, and a wait for the running
        checkpoint when the log has grown by another `limit` during it."""
        try:
            size = os.stat(self.wal).st_size
        except OSError:
            return
        if size < self._next_at:
            return
        self._wake.set()
        if size >= self._next_at + self.limit and not self._idle.is_set():
            self._idle.wait()

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        self._thread.join()

    def _work(self) -> None:
        conn: sqlite3.Connection | None = None
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._stopping:
                break
            self._idle.clear()
            try:
                if self._size() < self._next_at:
                    continue
                conn = conn or self._open()
                restarted = self._cycle(conn)
            except (OSError, sqlite3.Error):
                restarted = False  # the writer's TRUNCATE on close still brings the log home
            finally:
                self._idle.set()
            self._next_at = self.limit + 1 if restarted else self._size() + self.limit
        self._idle.set()
        if conn is not None:
            conn.close()

    def _open(self) -> sqlite3.Connection:
        conn = self._connect()
        conn.execute("PRAGMA busy_timeout=0")  # never wait on another process under the gate
        conn.execute("PRAGMA synchronous=NORMAL")  # its one write needs no commit sync
        conn.execute(f"PRAGMA journal_size_limit={self.limit}")
        return conn

    def _cycle(self, conn: sqlite3.Connection) -> bool:
        """Copy the log into the database and restart it; True when the log restarted."""
        before = self._commits()
        self.checkpoints += 1
        copied = _checkpoint(conn)  # the bulk, while steps go on committing
        with self._gate:
            # A step's commit that overlapped the copy (its frames, or the read mark it still
            # held when the copy began) has ended now: copy the rest here. Only a reader outside
            # the gate (another connection) can still stop it.
            if (not copied or self._commits() != before) and not _checkpoint(conn):
                return False  # a reader holds frames: wait for another `limit` of growth
            return self._restart(conn)

    def _restart(self, conn: sqlite3.Connection) -> bool:
        """Write the first commit of a fresh log (nothing changes: user_version is set to
        itself). SQLite restarts the log only if no reader is still using it; the file is then
        cut back to `limit`, which is how a restart is told from an append."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
            conn.execute(f"PRAGMA user_version={version}")
            conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise
        restarted = self._size() <= self.limit
        self.restarts += restarted
        return restarted

    def _size(self) -> int:
        try:
            return os.stat(self.wal).st_size
        except OSError:
            return 0


def _checkpoint(conn: sqlite3.Connection) -> bool:
    """A PASSIVE checkpoint (it waits for no reader or writer); True when every frame of the
    log is now in the database."""
    busy, log, copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    return not busy and log == copied
