"""Reading repository files the model names, with every read bounded, and saying what they are.

The file tools serve whatever a repository holds, and a repository can hold things that are not
files to read: a FIFO blocks whoever opens it until a writer appears, a device may never reach
end-of-file, a socket cannot be opened at all. `keel.tools.confine` opens paths (regular files
only, never blocking, never through a link out); this module names what a file is when it is
refused, tells text from binary, and reads lines within bounds.

Reads never take a whole file or a whole line: `bounded_lines` yields at most a given number of
bytes of each line and skips the rest in chunks, so a 200 MB file on one line costs kilobytes.
"""

from __future__ import annotations

import stat
from collections.abc import Iterator
from typing import BinaryIO

from keel.errors import ToolError

__all__ = [
    "SNIFF_BYTES",
    "FileToolError",
    "bounded_lines",
    "file_kind",
    "looks_binary",
    "not_regular",
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


def not_regular(shown: str, mode: int) -> FileToolError:
    """The refusal of a file that is not a regular file (`mode` says what it is instead)."""
    return FileToolError(
        f"{shown!r} is a {file_kind(mode)}, not a regular file; only regular files and "
        "directories can be used"
    )


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
