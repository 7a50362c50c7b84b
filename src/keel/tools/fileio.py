"""Opening and reading repository files the model names, with every read bounded.

The file tools serve whatever a repository holds, and a repository can hold things that are not
files to read: a FIFO blocks whoever opens it until a writer appears, a device may never reach
end-of-file, a socket cannot be opened at all. So a path is checked to be a regular file
before it is opened, and opened with ``O_NONBLOCK`` (so even a FIFO swapped in after the check
cannot block the open) and ``O_NOFOLLOW`` (so the final component cannot be swapped for a link
after the path was resolved), then checked again on the open descriptor, which closes the race.

Reads never take a whole file or a whole line: `bounded_lines` yields at most a given number of
bytes of each line and skips the rest in chunks, so a 200 MB file on one line costs kilobytes.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from keel.errors import ToolError

__all__ = [
    "FileToolError",
    "bounded_lines",
    "check_regular",
    "file_kind",
    "looks_binary",
    "open_for_write",
    "open_regular",
]

SNIFF_BYTES = 8192
_SKIP_CHUNK = 1 << 16
_KINDS = (
    (stat.S_ISDIR, "directory"),
    (stat.S_ISFIFO, "FIFO (named pipe)"),
    (stat.S_ISSOCK, "socket"),
    (stat.S_ISCHR, "character device"),
    (stat.S_ISBLK, "block device"),
    (stat.S_ISLNK, "symbolic link"),
)


class FileToolError(ToolError):
    """A file request the tools refuse or cannot serve; the message is for the model."""


def file_kind(mode: int) -> str:
    """What a `st_mode` is, in words."""
    if stat.S_ISREG(mode):
        return "regular file"
    return next((name for test, name in _KINDS if test(mode)), "special file")


def _refuse(shown: str, mode: int) -> FileToolError:
    return FileToolError(
        f"{shown!r} is a {file_kind(mode)}, not a regular file; only regular files and "
        "directories can be used"
    )


def check_regular(path: Path, shown: str) -> None:
    """Refuse `path` (an existing file) unless it is a regular file; `shown` names it."""
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise _refuse(shown, mode)


def _open_checked(path: Path, shown: str, flags: int, mode: int = 0o666) -> int:
    flags |= os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, mode)
    try:
        found = os.fstat(fd).st_mode
        if not stat.S_ISREG(found):
            raise _refuse(shown, found)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_regular(path: Path, shown: str) -> BinaryIO:
    """Open a regular file for reading, refusing anything else without blocking on it."""
    check_regular(path, shown)
    return os.fdopen(_open_checked(path, shown, os.O_RDONLY), "rb")


def open_for_write(path: Path, shown: str, append: bool) -> BinaryIO:
    """Open (or create) a regular file for writing; truncated unless `append`."""
    if os.path.lexists(path):
        check_regular(path, shown)
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else 0)
    fd = _open_checked(path, shown, flags)
    if not append:
        os.ftruncate(fd, 0)  # only now that the descriptor is known to be a regular file
    return os.fdopen(fd, "ab" if append else "wb")


def looks_binary(sample: bytes) -> bool:
    """NUL bytes, or mostly control bytes that are not valid UTF-8, mean binary."""
    if b"\x00" in sample:
        return True
    try:
        sample.decode("utf-8")
        return False
    except UnicodeDecodeError as exc:
        if exc.start >= len(sample) - 3:
            return False  # a multi-byte character cut by the sample's end
    control = sum(1 for b in sample if b < 32 and b not in b"\t\n\r\f\b")
    return control > len(sample) // 10


def bounded_lines(handle: BinaryIO, max_line_bytes: int) -> Iterator[tuple[bytes, int]]:
    """Each line as (its first `max_line_bytes` bytes, its whole length), newline removed.

    A line ending in CR LF loses the CR. The part of a long line past the limit is read in
    chunks and dropped, so memory stays bounded whatever the file holds.
    """
    while True:
        head = handle.readline(max_line_bytes)
        if not head:
            return
        if head.endswith(b"\n"):
            head = head[:-1].removesuffix(b"\r")
            yield head, len(head)
            continue
        rest = _skip_line(handle) if len(head) == max_line_bytes else 0
        yield head, len(head) + rest


def _skip_line(handle: BinaryIO) -> int:
    """Read past the rest of the current line in bounded chunks; its length, newline excluded."""
    skipped = 0
    while more := handle.readline(_SKIP_CHUNK):
        if more.endswith(b"\n"):
            return skipped + len(more) - 1
        skipped += len(more)
    return skipped
