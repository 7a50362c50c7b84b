"""File tools: list, read and search the files under one root directory, and nothing else.

Every path the model gives is resolved with symlinks followed and must land inside the root,
so ``../``, absolute paths and links pointing elsewhere are all refused the same way. Walks
never follow a link out of the root either: a link that leads outside is skipped, never read.
Paths in output are relative to the root, so the model can pass them straight back.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

from keel.errors import ConfigError, ToolError
from keel.tools.base import Effect, Tool, make_tool

MAX_LIST_ENTRIES = 1000
MAX_READ_LINES = 2000
MAX_SEARCH_MATCHES = 200
MAX_SEARCH_FILE_BYTES = 2_000_000
MAX_MATCH_LINE_CHARS = 400
_SKIP_DIRS = frozenset({".git"})
_SNIFF_BYTES = 8192


class FileToolError(ToolError):
    """A file request the tools refuse or cannot serve; the message is for the model."""


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
        read from the top, at most 2000 lines per call, and the header says how to read on.
        """
        return _read(base, path, start_line, end_line)

    def search_files(pattern: str, path: str = ".") -> str:
        """Search the text files under a directory (or one file) for a Python regular expression.
        Each match is printed as "path:line: text", path relative to the repository root.
        At most 200 matches are shown; binary files and files over 2 MB are skipped.
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
        suffix = "/" if entry.is_dir() else ""
        lines.append(base.rel(entry) + suffix)
    shown = lines[:MAX_LIST_ENTRIES]
    if not shown:
        shown = [f"({base.rel(directory)} is empty)"]
    if len(lines) > MAX_LIST_ENTRIES:
        shown.append(f"[... {len(lines) - MAX_LIST_ENTRIES} more entries not shown]")
    if outside:
        shown.append(f"[skipped {outside} link(s) leading outside the repository]")
    return "\n".join(shown)


def _read(base: Root, path: str, start_line: int | None, end_line: int | None) -> str:
    real = base.resolve(path)
    if not real.exists():
        raise FileToolError(f"no such file: {path!r}; use list_files to see what exists")
    if real.is_dir():
        raise FileToolError(f"{path!r} is a directory; use list_files to list it")
    if _is_binary(real):
        raise FileToolError(f"{path!r} is a binary file; only text files can be read")
    if start_line is not None and start_line < 1:
        raise FileToolError(f"start_line must be 1 or more, got {start_line}")
    if end_line is not None and end_line < (start_line or 1):
        raise FileToolError(f"end_line ({end_line}) is before start_line ({start_line or 1})")
    first = start_line or 1
    last = end_line if end_line is not None else first + MAX_READ_LINES - 1
    shown: list[str] = []
    total = 0
    for total, line in enumerate(_text_lines(real), start=1):
        if first <= total <= last:
            shown.append(f"{total:>6}\t{line}")
    rel = base.rel(real)
    if total == 0:
        return f"{rel}: (empty file)"
    if first > total:
        raise FileToolError(f"start_line {first} is past the end: {rel} has {total} lines")
    last_shown = min(last, total)
    header = f"{rel}: lines {first}-{last_shown} of {total}"
    if end_line is None and last_shown < total:
        header += f" (more remains: call again with start_line={last_shown + 1})"
    return header + "\n" + "\n".join(shown)


def _search(base: Root, pattern: str, path: str) -> str:
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise FileToolError(f"invalid regular expression {pattern!r}: {exc}") from None
    start = base.resolve(path)
    if not start.exists():
        raise FileToolError(f"no such file or directory: {path!r}")
    matches: list[str] = []
    for file in _walk(base, start):
        if file.stat().st_size > MAX_SEARCH_FILE_BYTES or _is_binary(file):
            continue
        rel = base.rel(file)
        for number, line in enumerate(_text_lines(file), start=1):
            if regex.search(line):
                if len(matches) == MAX_SEARCH_MATCHES:
                    matches.append(
                        f"[stopped at {MAX_SEARCH_MATCHES} matches; narrow the pattern or the path]"
                    )
                    return "\n".join(matches)
                if len(line) > MAX_MATCH_LINE_CHARS:
                    line = line[:MAX_MATCH_LINE_CHARS] + " [line cut]"
                matches.append(f"{rel}:{number}: {line}")
    if not matches:
        return f"no matches for {pattern!r} under {base.rel(start)}"
    return "\n".join(matches)


def _walk(base: Root, start: Path) -> Iterator[Path]:
    """Regular files under `start` in sorted order; never through a link out of the root."""
    if start.is_file():
        yield start
        return
    for dirpath, dirnames, filenames in os.walk(start, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        for name in sorted(filenames):
            file = Path(dirpath, name)
            if base.inside(file) and file.is_file():
                yield file


def _text_lines(path: Path) -> Iterator[str]:
    with path.open("r", encoding="utf-8", errors="replace", newline=None) as handle:
        for line in handle:
            yield line.rstrip("\n")


def _is_binary(path: Path) -> bool:
    """NUL bytes, or mostly control bytes that are not valid UTF-8, mean binary."""
    with path.open("rb") as handle:
        sample = handle.read(_SNIFF_BYTES)
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
