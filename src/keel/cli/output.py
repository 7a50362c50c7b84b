"""stdout for `keel run` and `keel resume`: whatever happens to it, the run does not notice.

The run's outcome is in the store, so output is a copy, and a copy that cannot be delivered is
no reason for a traceback or a different end: a reader that left (`| head -1`, a broken pipe),
a descriptor that was closed before Keel started (`>&-`), a full disk (`> /dev/full`). The
first failure is kept, later writes are dropped, and the command says in one line on stderr
what was not written and where the run is (`failure`).

Lines go to the descriptor with `os.write`, not through `sys.stdout`'s buffer: a reader that
stops reading blocks only the thread that writes, without holding the buffer's lock, so a
signal still ends the process (a daemon thread holding that lock at exit makes the interpreter
abort). A stream without a descriptor (a test's captured output) is written as a stream.
"""

from __future__ import annotations

import errno
import os
import sys
import threading
from typing import TextIO

__all__ = ["Stdout", "keep_standard_fds"]


class Stdout:
    """Writes to stdout that never raise; `failure` says why output stopped, else None."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = sys.stdout if stream is None else stream
        self._fd = _descriptor(self._stream)
        self._encoding = getattr(self._stream, "encoding", None) or "utf-8"
        self._lock = threading.Lock()
        self.failure: str | None = None
        if self._stream is None:  # Python found descriptor 1 closed at start
            self.failure = "stdout is closed"

    def write(self, text: str) -> int:
        """Write `text` (or drop it, once a write has failed); returns its length."""
        with self._lock:
            if self.failure is None:
                try:
                    self._write(text)
                except (OSError, ValueError) as exc:  # ValueError: a closed stream object
                    self.failure = _describe(exc)
                    if self._fd is not None:
                        _silence(self._fd)
        return len(text)

    def flush(self) -> None:
        """Lines are written as they come; a stream object is flushed in `write`."""

    def line(self, text: str) -> None:
        self.write(text + "\n")

    def _write(self, text: str) -> None:
        if self._fd is None:
            self._stream.write(text)
            self._stream.flush()
            return
        data = memoryview(text.encode(self._encoding, errors="replace"))
        while data:
            data = data[os.write(self._fd, data) :]


def keep_standard_fds() -> None:
    """Put /dev/null on descriptors 0-2 when they are closed, so no file Keel opens later (a
    store, a blob) can get one of them, and nothing meant for stdout ever lands in it."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)


def _descriptor(stream: TextIO | None) -> int | None:
    """The stream's descriptor, once what its buffer holds is out; None when it has none."""
    if stream is None:
        return None
    try:
        stream.flush()
        return stream.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both
        return None


def _describe(exc: OSError | ValueError) -> str:
    code = getattr(exc, "errno", None)
    if isinstance(exc, BrokenPipeError) or code == errno.EPIPE:
        return "stdout was closed by its reader (broken pipe)"
    if isinstance(exc, ValueError) or code == errno.EBADF:
        return "stdout is closed"
    reason = getattr(exc, "strerror", None) or str(exc)
    return f"stdout could not be written ({reason})"


def _silence(fd: int) -> None:
    """After a failed write, point the descriptor at /dev/null: whatever still holds bytes for
    it (Python's own buffer of stdout, flushed at exit) then drains without another error."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, fd)
        os.close(null)
    except OSError:
        pass
