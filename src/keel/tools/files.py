"""File tools: list, read and search the files under one root directory, and nothing else.

Every path the model gives is resolved with symlinks followed and must land inside the root,
so ``../``, absolute paths and links pointing elsewhere are all refused the same way. Walks
never follow a link out of the root either: a link that leads outside is skipped, never read.
Paths in output are relative to the root, so the model can pass them straight back.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from keel.errors import ConfigError
from keel.tools.base import Effect, Tool, make_tool
from keel.tools.fileio import (
    SNIFF_BYTES,
    FileToolError,
    bounded_lines,
    check_regular,
    file_kind,
    looks_binary,
    open_regular,
)
from keel.tools.search import Pattern, compile_pattern

__all__ = [
    "MAX_LINE_BYTES",
    "MAX_READ_BYTES",
    "MAX_READ_LINES",
    "MAX_SEARCH_FILE_BYTES",
    "MAX_SEARCH_MATCHES",
    "MAX_SEARCH_TOTAL_BYTES",
    "FileToolError",
    "Root",
    "file_tools",
]

MAX_LIST_ENTRIES = 1000
MAX_READ_LINES = 2000
MAX_READ_BYTES = 200_000
"""Bytes of a file one read_file call shows."""
MAX_LINE_BYTES = 20_000
"""Bytes of one line read_file shows; the rest of a longer line is skipped."""
MAX_SCAN_BYTES = 64_000_000
"""How far into a file one read_file call goes, to reach start_line and to count lines."""
MAX_SEARCH_MATCHES = 200
MAX_SEARCH_FILE_BYTES = 2_000_000
MAX_SEARCH_TOTAL_BYTES = 50_000_000
MAX_SEARCH_FILES = 20_000
MAX_MATCH_LINE_CHARS = 400
_SKIP_DIRS = frozenset({".git"})
_COUNT_CHUNK = 1 << 20


class Root:
    """The one directory the tools may see, and the checks that keep them inside it."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.path = Path(root).resolve()
        if not self.path.is_dir():
            raise ConfigError(f"file tools: root {str(root)!r} is not a directory")

    def resolve(self, requested: str) -> Path:
        """The real path of `requested` (relative to the root), refused if it leaves the root."""
        real = Path(os.path.realpath(self.path / requested))
        if not self.contains(real):
            raise FileToolError(f"{requested!r} is outside the repository; use a path inside it")
        return real

    def contains(self, real: Path) -> bool:
        return real == self.path or real.is_relative_to(self.path)

    def inside(self, path: Path) -> bool:
        """Whether `path`, with every symlink followed, stays inside the root."""
        return self.contains(Path(os.path.realpath(path)))

    def rel(self, path: Path | str) -> str:
        relative = os.path.relpath(path, self.path)
        return "." if relative == "." else Path(relative).as_posix()


def file_tools(root: str | os.PathLike[str]) -> list[Tool]:
    """`list_files`, `read_file` and `search_files`, all read_only, confined to `root`."""
    base = Root(root)

    def list_files(path: str = ".") -> str:
        """List one directory of the repository (not recursive), sorted by name.
        Directories end with "/". Paths are relative to the repository root and can be passed
        to read_file or to list_files again. Use search_files to find text across many files.
        """
        return _list(base, path)

    def read_file(path: str, start_line: int | None = None, end_line: int | None = None) -> str:
        """Read a text file of the repository, each line prefixed with its line number.
        start_line and end_line (1-based, inclusive) select a range; without them the file is
        read from the top, at most 2000 lines (and 200 KB) per call, and the header says how to
        read on. Lines longer than 20 KB are cut, and the header says so.
        """
        return _read(base, path, start_line, end_line)

    def search_files(pattern: str, path: str = ".") -> str:
        """Search the text files under a directory (or one file) for a regular expression.
        The syntax is Python's re without backreferences or lookaround (RE2), matched one line
        at a time. Each match is printed as "path:line: text", path relative to the repository
        root. At most 200 matches are shown; binary files and files over 2 MB are skipped.
        """
        return _search(base, pattern, path)

    return [
        make_tool(fn, description=" ".join((fn.__doc__ or "").split()), effect=Effect.READ_ONLY)
        for fn in (list_files, read_file, search_files)
    ]


def _list(base: Root, path: str) -> str:
    directory = base.resolve(path)
    if not directory.exists():
        raise FileToolError(f"no such directory: {path!r}")
    if not directory.is_dir():
        check_regular(directory, path)
        raise FileToolError(f"{path!r} is a file, not a directory; use read_file to read it")
    lines: list[str] = []
    outside = 0
    entries = sorted(directory.iterdir(), key=lambda p: p.name)
    for entry in entries:
        if entry.name in _SKIP_DIRS:
            continue
        if not base.inside(entry):
            outside += 1
            continue
        lines.append(base.rel(entry) + _list_suffix(entry))
    shown = lines[:MAX_LIST_ENTRIES]
    if not shown:
        shown = [f"({base.rel(directory)} is empty)"]
    if len(lines) > MAX_LIST_ENTRIES:
        shown.append(f"[... {len(lines) - MAX_LIST_ENTRIES} more entries not shown]")
    if outside:
        shown.append(f"[skipped {outside} link(s) leading outside the repository]")
    return "\n".join(shown)


def _list_suffix(entry: Path) -> str:
    """ "/" for a directory, a warning for a special file (a FIFO, a device), else nothing."""
    try:
        mode = entry.stat().st_mode
    except OSError:
        return ""
    if stat.S_ISDIR(mode):
        return "/"
    if stat.S_ISREG(mode):
        return ""
    return f" [{file_kind(mode).split(' (')[0]}: not a regular file]"


def _read(base: Root, path: str, start_line: int | None, end_line: int | None) -> str:
    real = base.resolve(path)
    if not real.exists():
        raise FileToolError(f"no such file: {path!r}; use list_files to see what exists")
    if real.is_dir():
        raise FileToolError(f"{path!r} is a directory; use list_files to list it")
    if start_line is not None and start_line < 1:
        raise FileToolError(f"start_line must be 1 or more, got {start_line}")
    if end_line is not None and end_line < (start_line or 1):
        raise FileToolError(f"end_line ({end_line}) is before start_line ({start_line or 1})")
    first = start_line or 1
    last = end_line if end_line is not None else first + MAX_READ_LINES - 1
    rel = base.rel(real)
    with open_regular(real, path) as handle:
        if looks_binary(handle.read(SNIFF_BYTES)):
            raise FileToolError(f"{path!r} is a binary file; only text files can be read")
        handle.seek(0)
        return _page(handle, rel, first, last, explicit_end=end_line is not None)


def _page(handle: BinaryIO, rel: str, first: int, last: int, explicit_end: bool) -> str:
    """Lines `first`..`last` of an open file, within the byte budgets, under a header."""
    shown: list[str] = []
    cut: list[str] = []
    used = scanned = number = 0
    budget_hit = False
    for number, (head, length) in enumerate(bounded_lines(handle, MAX_LINE_BYTES), start=1):
        scanned += length + 1
        if number < first:
            if scanned > MAX_SCAN_BYTES:
                raise FileToolError(
                    f"start_line {first} lies beyond the first {MAX_SCAN_BYTES} bytes of {rel}, "
                    "which is as far as read_file reads into a file"
                )
            continue
        cost = len(head) + 1
        if shown and used + cost > MAX_READ_BYTES:
            budget_hit = True
            break
        used += cost
        if length > len(head):
            cut.append(f"line {number} is cut: {length} bytes, only the first {len(head)} shown")
        shown.append(f"{number:>6}\t{head.decode('utf-8', errors='replace')}")
        if number == last:
            break
    if number == 0:
        return f"{rel}: (empty file)"
    if not shown:
        raise FileToolError(f"start_line {first} is past the end: {rel} has {number} lines")
    last_shown = first + len(shown) - 1
    total, complete = _count_rest(handle, number, scanned)
    header = f"{rel}: lines {first}-{last_shown} of {'' if complete else 'more than '}{total}"
    if budget_hit or (not explicit_end and last_shown < total):
        why = "the size limit for one read was reached; " if budget_hit else ""
        header += f" (more remains: {why}call again with start_line={last_shown + 1})"
    return "\n".join([header, *(f"({note})" for note in cut), *shown])


def _count_rest(handle: BinaryIO, counted: int, scanned: int) -> tuple[int, bool]:
    """Lines in the file, given `counted` read so far, and whether it was read to the end
    (counting stops at the scan budget)."""
    tail = b"\n"
    while scanned <= MAX_SCAN_BYTES:
        chunk = handle.read(_COUNT_CHUNK)
        if not chunk:
            return counted + (0 if tail.endswith(b"\n") else 1), True
        counted += chunk.count(b"\n")
        scanned += len(chunk)
        tail = chunk
    return counted, False


def _search(base: Root, pattern: str, path: str) -> str:
    compiled = compile_pattern(pattern)
    start = base.resolve(path)
    if not start.exists():
        raise FileToolError(f"no such file or directory: {path!r}")
    if not start.is_dir():
        check_regular(start, path)
    matches: list[str] = []
    searched = files = 0
    for file in _walk(base, start):
        data = _search_text(file)
        if data is None:
            continue
        if files == MAX_SEARCH_FILES or searched + len(data) > MAX_SEARCH_TOTAL_BYTES:
            matches.append(
                f"[stopped after searching {files} files ({searched} bytes), the limit for one "
                "search; narrow the path to search the rest]"
            )
            break
        files += 1
        searched += len(data)
        if _collect(compiled, data, base.rel(file), matches):
            break
    if not matches:
        return f"no matches for {pattern!r} under {base.rel(start)}"
    return "\n".join(matches)


def _search_text(file: Path) -> bytes | None:
    """The text of a file to search, or None for a binary, oversized or special file."""
    try:
        with open_regular(file, str(file)) as handle:
            data = handle.read(MAX_SEARCH_FILE_BYTES + 1)
    except (FileToolError, OSError):
        return None  # vanished or replaced by a special file since the walk saw it
    if len(data) > MAX_SEARCH_FILE_BYTES or looks_binary(data[:SNIFF_BYTES]):
        return None
    return data.replace(b"\r\n", b"\n")


def _collect(compiled: Pattern, data: bytes, rel: str, matches: list[str]) -> bool:
    """Add the matching lines of one file; True once the match cap is reached."""
    for number, raw in compiled.matching_lines(data):
        if len(matches) == MAX_SEARCH_MATCHES:
            matches.append(
                f"[stopped at {MAX_SEARCH_MATCHES} matches; narrow the pattern or the path]"
            )
            return True
        line = raw[: MAX_MATCH_LINE_CHARS * 4].decode("utf-8", errors="replace")
        if len(line) > MAX_MATCH_LINE_CHARS or len(raw) > MAX_MATCH_LINE_CHARS * 4:
            line = line[:MAX_MATCH_LINE_CHARS] + " [line cut]"
        matches.append(f"{rel}:{number}: {line}")
    return False


def _walk(base: Root, start: Path) -> Iterator[Path]:
    """Regular files under `start` in sorted order; never through a link out of the root."""
    if not start.is_dir():
        yield start
        return
    for dirpath, dirnames, filenames in os.walk(start, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        for name in sorted(filenames):
            file = Path(dirpath, name)
            if base.inside(file) and file.is_file():
                yield file
