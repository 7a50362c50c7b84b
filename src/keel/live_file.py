"""The model's text as it is written, in a small side file another process can read (ADR 0039).

`keel ui` usually runs in another process than the run, and reads runs from the store, where
deltas never go. So a run that has a `LiveFiles` among its text listeners writes the current
attempt's text to `<store>.live/<quoted run id>.txt`, beside the store and never inside it:
a header line (`{"step": S, "attempt": A}`), then the text as it arrives. A new attempt starts
the file anew; it is removed when the attempt is discarded, when the next request is sent (the
answer is recorded by then), and when the run ends or pauses. At most `MAX_BYTES` of an
attempt's text are kept. Nothing of this runs unless the listener is given: `keel run` gives it
only when `keel ui` made the directory (`wanted`), so a run nobody watches does not stream.

The directory sits beside the store, where others may write too (ADR 0048): `keel ui` makes it
with mode 0700 (`make_live_dir`), and a file is written only in a directory that is no link,
is the user's own and lets no one else in; the file is opened without following a link planted
in its place (O_NOFOLLOW), with mode 0600. Otherwise nothing is written and the run goes on.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from pathlib import Path
from typing import IO
from urllib.parse import quote

from keel.records import (
    ApprovalRequested,
    Event,
    ModelRequestSent,
    RunCancelled,
    RunCompleted,
    RunFailed,
)
from keel.transports.streaming import TextDelta, TextDiscarded, TextEvent

__all__ = [
    "MAX_BYTES",
    "NOFOLLOW",
    "LiveFiles",
    "RunLiveFile",
    "live_dir",
    "live_path",
    "make_live_dir",
    "wanted",
]

MAX_BYTES = 64 * 1024
"""Of one attempt's text, what is written at most (the UI reads no more)."""
_ENDS = (ModelRequestSent, ApprovalRequested, RunCompleted, RunFailed, RunCancelled)
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
"""Opening a link fails (ELOOP) instead of following it."""
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


def live_dir(store: str | Path) -> Path:
    """The directory of a SQLite store's live files."""
    store = Path(store)
    return store.with_name(store.name + ".live")


def live_path(directory: Path, run_id: str) -> Path:
    """The live file of `run_id` (quoted: a run id never names another path)."""
    return directory / (quote(run_id, safe="") + ".txt")


def make_live_dir(directory: Path) -> None:
    """Make the live directory, private to the user (0700); OSError when it cannot be."""
    directory.mkdir(mode=0o700, exist_ok=True)


def _private_dir(directory: Path) -> int | None:
    """The directory opened (a descriptor), when it is no link, is the user's own and lets no
    one else in; None otherwise: nothing is written there."""
    try:
        fd = os.open(directory, os.O_RDONLY | _DIRECTORY | NOFOLLOW)
    except OSError:
        return None
    info = os.fstat(fd)
    getuid = getattr(os, "getuid", None)
    mine = getuid is None or info.st_uid == getuid()
    if stat.S_ISDIR(info.st_mode) and mine and stat.S_IMODE(info.st_mode) & 0o077 == 0:
        return fd
    os.close(fd)
    return None


def wanted(store: object) -> LiveFiles | None:
    """The live files of a SQLite store whose directory exists (`keel ui` made it); else None:
    the run streams nothing to a file."""
    if not isinstance(store, str | Path) or str(store).startswith(("postgres://", "postgresql://")):
        return None
    directory = live_dir(store)
    return LiveFiles(directory) if directory.is_dir() else None


class LiveFiles:
    """A text listener for runs of one store: each run writes its own file (`for_run`)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def for_run(self, run_id: str) -> RunLiveFile:
        return RunLiveFile(live_path(self.directory, run_id))

    def __call__(self, event: TextEvent) -> None:
        """Unbound (a run that did not call `for_run`): nothing is written."""


class RunLiveFile:
    """One run's live file: a text listener, and an event listener for when it is done."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._attempt: tuple[int, int] | None = None
        self._handle: IO[bytes] | None = None
        self._written = 0
        self._made = False
        """The file was made (and not yet removed): only then is there anything to remove."""

    def __call__(self, event: TextEvent) -> None:
        if isinstance(event, TextDiscarded):
            self.remove()
            return
        if self._attempt != (event.step, event.attempt):
            self._start(event)
        if self._handle is None or self._written >= MAX_BYTES:
            return
        data = event.text.encode("utf-8")[: MAX_BYTES - self._written]
        self._handle.write(data)
        self._handle.flush()
        self._written += len(data)

    def heard(self, event: Event) -> None:
        """An event of the run: the attempt's text is recorded, or the run stops here."""
        if isinstance(event, _ENDS):
            self.remove()

    def remove(self) -> None:
        self.close()
        self._attempt = None
        if not self._made:
            return
        self._made = False
        with contextlib.suppress(OSError):
            self.path.unlink(missing_ok=True)

    def close(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            with contextlib.suppress(OSError):
                handle.close()

    def _start(self, delta: TextDelta) -> None:
        self.close()
        self._attempt, self._written = (delta.step, delta.attempt), 0
        head = json.dumps({"step": delta.step, "attempt": delta.attempt}) + "\n"
        directory = _private_dir(self.path.parent)
        if directory is None:
            return  # not a folder of the user's own: the UI shows no text; the run goes on
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(self.path.name, flags, 0o600, dir_fd=directory)
            handle = os.fdopen(fd, "wb")
            self._made = True
            handle.write(head.encode())
            handle.flush()
        except OSError:
            return  # the UI shows no text; the run goes on
        finally:
            os.close(directory)
        self._handle = handle
