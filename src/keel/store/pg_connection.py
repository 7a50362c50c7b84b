"""The Postgres store's connections, and psycopg's errors mapped once, here, into StoreError.

A small pool of threads, each owning one psycopg connection, so the event loop never waits on
the network and several runs of one worker commit at once (Postgres groups their WAL flushes
itself). A job, once submitted, runs whole even if its caller stops waiting: cancelling the
awaiting task cannot drop a step half-handed over (the same promise as the SQLite worker). A
connection that broke is dropped and the next job connects again, so a database restart costs
the steps that were in flight, never the process.

Nothing here ever prints or raises the URL's password: messages name the store by its redacted
URL and any text from the server is scrubbed of the password before it is shown.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

import psycopg
from psycopg import errors as pg

from keel.errors import StoreError
from keel.store.failures import described

__all__ = ["Connections", "connect_error", "store_error"]

T = TypeVar("T")
Work = Callable[[psycopg.Connection[Any]], T]
CONNECT_TIMEOUT = 5


class Connections:
    """Threads that each own one connection; `submit(work)` runs `work(conn)` in a
    transaction on one of them."""

    def __init__(self, url: str, where: str, *, size: int, read_only: bool = False) -> None:
        self.url = url
        self.where = where
        self.read_only = read_only
        self._secret = _password(url)
        self._local = threading.local()
        self._open: list[psycopg.Connection[Any]] = []
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=size, thread_name_prefix="keel-pg")

    def connect(self) -> psycopg.Connection[Any]:
        """A new connection, or StoreError saying in one line why there is none."""
        try:
            conn = psycopg.connect(
                self.url,
                connect_timeout=CONNECT_TIMEOUT,
                application_name="keel",
                options="-c default_transaction_read_only=on" if self.read_only else None,
            )
        except psycopg.Error as exc:
            raise connect_error(self.where, exc, self._secret) from None
        with self._lock:
            self._open.append(conn)
        return conn

    def submit(self, work: Work[T], *, pipeline: bool = False) -> Future[T]:
        """`pipeline`: send the transaction's statements without waiting for each (psycopg's
        pipeline mode); `work` syncs where it needs a result. A step costs two round trips."""
        future: Future[T] = self._pool.submit(self._run, work, pipeline)
        return future

    def run(self, work: Work[T]) -> T:
        return self.submit(work).result()

    def _run(self, work: Work[T], pipeline: bool = False) -> T:
        conn: psycopg.Connection[Any] | None = getattr(self._local, "conn", None)
        if conn is None or conn.closed or conn.broken:
            conn = self._local.conn = self.connect()
        try:
            if pipeline:
                with conn.pipeline(), conn.transaction():
                    return work(conn)
            with conn.transaction():
                return work(conn)
        except psycopg.Error as exc:  # Keel's own refusals roll back and keep the connection
            if isinstance(exc, psycopg.OperationalError) or conn.broken:
                self._drop(conn)
            raise

    def _drop(self, conn: psycopg.Connection[Any]) -> None:
        self._local.conn = None
        with contextlib.suppress(psycopg.Error):
            conn.close()
        with self._lock, contextlib.suppress(ValueError):
            self._open.remove(conn)

    def scrub(self, text: str) -> str:
        return _scrub(text, self._secret)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        with self._lock:
            for conn in self._open:
                with contextlib.suppress(psycopg.Error):
                    conn.close()
            self._open.clear()


def _password(url: str) -> str | None:
    try:
        parts = urlsplit(url)
    except ValueError:
        return None
    if parts.password:
        return unquote(parts.password)
    for pair in parts.query.split("&"):
        key, _, value = pair.partition("=")
        if key == "password" and value:
            return unquote(value)
    return None


def _scrub(text: str, secret: str | None) -> str:
    if secret:
        text = text.replace(secret, "***")
    return text


def _first_line(exc: BaseException, secret: str | None) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = " ".join(lines[0].split()) if lines else type(exc).__name__
    return _scrub(text, secret)


def connect_error(where: str, exc: BaseException, secret: str | None = None) -> StoreError:
    """Why no connection could be made, in one line: refused, unknown host, bad password, no
    such database."""
    detail = _first_line(exc, secret)
    if isinstance(exc, pg.InvalidPassword) or "password authentication failed" in detail:
        return StoreError(
            f"the store {where} refused the login ({detail}): check the user and "
            "password in the URL"
        )
    if "does not exist" in detail:
        return StoreError(
            f"the store {where} cannot be used ({detail}): create the database first (createdb)"
        )
    return StoreError(f"cannot reach the store {where} ({detail}): is Postgres running there?")


def store_error(
    where: str,
    exc: BaseException,
    doing: str = "",
    *,
    resume: str | None = None,
    secret: str | None = None,
) -> StoreError:
    """A failure of a statement, as one line: what happened, what was not saved, what to do."""
    if isinstance(exc, StoreError):
        return exc
    detail = _first_line(exc, secret)
    fix, resumable = "", True
    if isinstance(exc, pg.DiskFull):
        what, fix = f"the store {where} is full ({detail})", "free space on the database server"
    elif isinstance(exc, pg.ReadOnlySqlTransaction):
        what, fix = f"the store {where} is read-only ({detail})", "use a writable database"
    elif isinstance(exc, psycopg.OperationalError):
        what, fix = f"the store {where} could not be reached ({detail})", "check the database"
    else:
        what, resumable = f"the store {where} failed ({detail})", False
    return described(what, fix, resumable, doing, resume)
