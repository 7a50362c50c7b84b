"""SQLite and file-system failures of the store, mapped once, here, into StoreError: what
happened to which file, what was not saved, and what to do. Nothing else in Keel looks at a
`sqlite3` exception. The Postgres store words its failures with the same `described`.
"""

from __future__ import annotations

import sqlite3

from keel.errors import StoreError

__all__ = ["StoreMoved", "described", "newer_schema", "store_error"]

# Primary SQLite result codes (extended codes carry them in their low byte).
_READONLY, _IOERR, _CORRUPT, _FULL, _CANTOPEN, _NOTADB = 8, 10, 11, 13, 14, 26
_BUSY, _LOCKED = 5, 6


class StoreMoved(Exception):
    """The file at the store's path is not the one this process opened (deleted, replaced)."""


def newer_schema(path: str, found: int, known: int) -> StoreError:
    return StoreError(
        f"the store {path} was written by a newer Keel (schema {found}; this one knows "
        f"{known}): upgrade Keel, or use another --store"
    )


def store_error(
    path: str, exc: BaseException, doing: str = "", *, resume: str | None = None
) -> StoreError:
    """`doing` says what was lost ("step 4 could not be saved"); `resume` names the run to
    resume once the cause is fixed, when the failure leaves it resumable."""
    if isinstance(exc, StoreError):
        return exc
    what, fix, resumable = _describe(path, exc)
    return described(what, fix, resumable, doing, resume)


def described(what: str, fix: str, resumable: bool, doing: str, resume: str | None) -> StoreError:
    """One line for any store: what happened, what was not saved (`doing`), what to do, and
    the run to resume afterwards when the failure leaves it resumable."""
    message = f"{what}: {doing}" if doing else what
    if fix and resume and resumable:
        message += f" — {fix}, then `keel resume {resume}`"
    elif fix:
        message += f" — {fix}"
    return StoreError(message)


def _describe(path: str, exc: BaseException) -> tuple[str, str, bool]:
    """(what happened, what to do, whether resuming afterwards continues the run)."""
    if isinstance(exc, StoreMoved):
        return (
            f"the store file {path} was deleted or replaced while this process was using it",
            "nothing more is written to the old file; put the store back at that path",
            True,
        )
    if not isinstance(exc, sqlite3.Error):
        return f"the store {path} failed ({type(exc).__name__}: {exc})", "", False
    code = (getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF
    detail = str(exc)
    if code == _FULL:
        return f"the store {path} is full", "free space", True
    if code == _READONLY:
        return f"the store {path} is read-only ({detail})", "make it writable", True
    if code == _IOERR:
        return f"the store {path} could not be read or written ({detail})", "check the disk", True
    if code in (_CORRUPT, _NOTADB):
        return (
            f"the store {path} is not a Keel store or is damaged ({detail})",
            "restore it from a backup, or use another --store",
            False,
        )
    if code == _CANTOPEN:
        return (
            f"the store {path} cannot be opened ({detail})",
            "check the file and its folder's permissions",
            True,
        )
    if code in (_BUSY, _LOCKED):
        return f"the store {path} stayed locked by another process ({detail})", "retry", True
    return f"the store {path} failed ({detail})", "", False
