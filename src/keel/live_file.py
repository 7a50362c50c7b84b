"""The model's text as it is written, in a small side file another process can read (ADR 0039).

`keel ui` usually runs in another process than the run, and reads runs from the store, where
deltas never go. So a run that has a `LiveFiles` among its text listeners writes the current
attempt's text to `<store>.live/<quoted run id>.txt`, beside the store and never inside it:
a header line (`{"step": S, "attempt": A}`), then the text as it arrives. A new attempt starts
the file anew; it is removed when the attempt is discarded, when the next request is sent (the
answer is recorded by then), and when the run ends or pauses. At most `MAX_BYTES` of an
attempt's text are kept. Nothing of this runs unless the listener is given: `keel run` gives it
only when `keel ui` made the directory (`wanted`), so a run nobody watches does not stream.
"""

from __future__ import annotations

import contextlib
import json
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

__all__ = ["MAX_BYTES", "LiveFiles", "RunLiveFile", "live_dir", "live_path", "wanted"]

MAX_BYTES = 64 * 1024
"""Of one attempt's text, what is written at most (the UI reads no more)."""
_ENDS = (ModelRequestSent, ApprovalRequested, RunCompleted, RunFailed, RunCancelled)


def live_dir(store: str | Path) -> Path:
    """The directory of a SQLite store's live files."""
    store = Path(store)
    return store.with_name(store.name + ".live")


def live_path(directory: Path, run_id: str) -> Path:
    """The live file of `run_id` (quoted: a run id never names another path)."""
    return directory / (quote(run_id, safe="") + ".txt")


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
        try:
            handle = open(self.path, "wb")  # noqa: SIM115 (kept open for the attempt)
            self._made = True
            handle.write(head.encode())
            handle.flush()
        except OSError:
            return  # the UI shows no text; the run goes on
        self._handle = handle
