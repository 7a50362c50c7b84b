"""File tools: list, read and search the files under one root directory, and nothing else.

Every open, `stat` and listing goes through `keel.tools.confine`: paths are walked one name at a
time from a handle on the root, links inside the root are followed by walking their target
again, and ``../``, absolute paths, links pointing elsewhere and hard-linked files are refused.
Walks never follow a link out of the root, nor a link to a directory at all: a link that leads
outside is skipped, never read. Paths in output are relative to the root, so the model can pass
them straight back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import stat
from collections.abc import Callable, Generator
from typing import Annotated, BinaryIO

from pydantic import Field

from keel.tools.base import Effect, Tool, make_tool
from keel.tools.confine import MAX_WALK_DEPTH, Opened, Outside, Root, Walk
from keel.tools.fileio import SNIFF_BYTES, FileToolError, bounded_lines, file_kind, looks_binary
from keel.tools.guidance import (
    END_OF_FILE,
    at_the_last_line,
    found_one_folder_down,
    nearby,
    next_read,
    past_the_end,
    shorten_read,
)
from keel.tools.ignore import IgnoreRules
from keel.tools.search import Pattern, compile_pattern

__all__ = [
    "MAX_LINE_BYTES",
    "MAX_READ_BYTES",
    "MAX_READ_LINES",
    "MAX_SEARCH_FILE_BYTES",
    "MAX_SEARCH_MATCHES",
    "MAX_SEARCH_TOTAL_BYTES",
    "FileToolError",
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
LINES_AFTER_ONE_MATCH = 12
"""A search that finds one line shows this many lines after it (as ``grep -A``): asked for a
function's parameters, the local model searched for its ``def`` line, was given only that line,
and sent the same search again (issue 25). No call to read on is suggested: the model copied
such a note into its answer instead of the parameters."""
RepoPath = Annotated[
    str,
    Field(
        description="A path relative to the repository root, folders separated by \"/\", as "
        "the question or a list_files result writes it; \".\" is the root."
    ),
]
_COUNT_CHUNK = 1 << 20


def file_tools(root: str | os.PathLike[str]) -> list[Tool]:
    """`list_files`, `read_file` and `search_files`, all read_only, confined to `root`."""
    base = Root(root)

    def list_files(path: RepoPath = ".") -> str:
        """List one directory of the repository (not recursive), sorted by name.
        Directories end with "/"; files with several hard links are marked, and cannot be read.
        What the repository ignores (.gitignore, virtual environments, caches) is left out and
        named at the end.
        Paths are relative to the repository root ("/" is the root too) and can be passed to
        read_file or to list_files again. Use search_files to find text across many files.
        """
        return _list(base, path)

    def read_file(
        path: RepoPath, start_line: int | None = None, end_line: int | None = None
    ) -> str:
        """Read a text file of the repository, each line prefixed with its line number.
        start_line and end_line (1-based, inclusive) select a range; without them the file is
        read from the top, at most 2000 lines (and 200 KB) per call, and the header says how to
        read on. Lines longer than 20 KB are cut, and the header says so. A file with several
        hard links is refused: it may be a file outside the repository.
        """
        return _read(base, path, start_line, end_line)

    def search_files(pattern: str, path: RepoPath = ".") -> str:
        """Search the text files under a directory (or one file) for a regular expression.
        The syntax is Python's re without backreferences or lookaround (RE2), matched one line
        at a time. Each match is printed as "path:line: text", path relative to the repository
        root. At most 200 matches are shown; binary files, files over 2 MB and hard-linked
        files are skipped, and so is what the repository ignores (its .gitignore files,
        virtual environments, caches): the result names what it skipped, and a path named
        explicitly is searched whole.
        """
        return _search(base, pattern, path)

    tools = [
        make_tool(fn, description=" ".join((fn.__doc__ or "").split()), effect=Effect.READ_ONLY)
        for fn in (list_files, read_file, search_files)
    ]
    tools[1] = dataclasses.replace(tools[1], shorten=shorten_read)  # says how to read on
    return tools


def _open(base: Root, path: str, missing: str) -> Opened:
    """`base.open`, with a missing or refused path answered by what exists near it."""
    try:
        return base.open(path)
    except FileNotFoundError:
        raise FileToolError(f"{missing}: {path!r}.{nearby(base, path)}") from None
    except Outside as exc:
        raise FileToolError(f"{exc}.{nearby(base, '.')}") from None


def _list(base: Root, path: str) -> str:
    with _open(base, path, "no such directory") as directory:
        if not directory.is_dir:  # as `ls FILE` does: the file itself, and how to read it
            size, read = directory.st.st_size, next_read(directory.rel)
            return f"{directory.rel} ({size} bytes) is a file: read it with {read}"
        rules = IgnoreRules.for_walk(base, directory.rel)
        entries = [
            (name, st, rel)
            for name, st in base.entries(directory)
            if not rules.entry_skipped(directory.fd, name, rel := _join(directory.rel, name), st)
        ]
    lines: list[str] = []
    outside = 0
    for _name, st, rel in entries:
        try:
            target = base.lookup(rel) if stat.S_ISLNK(st.st_mode) else st
        except Outside:
            outside += 1
            continue
        except (FileToolError, OSError):
            target = None  # a dangling link, a loop: listed, but nothing to say about it
        lines.append(rel + _list_suffix(target))
    shown = lines[:MAX_LIST_ENTRIES]
    if not shown:
        shown = [f"({directory.rel} is empty)"]
    if len(lines) > MAX_LIST_ENTRIES:
        shown.append(f"[... {len(lines) - MAX_LIST_ENTRIES} more entries not shown]")
    if outside:
        shown.append(f"[skipped {outside} link(s) leading outside the repository]")
    note = rules.skipped.note("not listed", _list_call)
    if note:
        shown.append(note)
    return "\n".join(shown)


def _join(folder: str, name: str) -> str:
    return name if folder == "." else f"{folder}/{name}"


def _list_call(rel: str) -> str:
    return f"list_files {json.dumps({'path': rel}, ensure_ascii=False)}"


def _list_suffix(st: os.stat_result | None) -> str:
    """ "/" for a directory, a warning for a hard link or a special file, else nothing."""
    if st is None:
        return ""
    if stat.S_ISDIR(st.st_mode):
        return "/"
    if stat.S_ISREG(st.st_mode):
        return " [hard link: not read]" if st.st_nlink > 1 else ""
    return f" [{file_kind(st.st_mode).split(' (')[0]}: not a regular file]"


def _read(base: Root, path: str, start_line: int | None, end_line: int | None) -> str:
    if start_line is not None and start_line < 1:
        raise FileToolError(f"start_line must be 1 or more, got {start_line}")
    if end_line is not None and end_line < (start_line or 1):
        raise FileToolError(f"end_line ({end_line}) is before start_line ({start_line or 1})")
    note = ""
    try:
        opened = base.open(path)
    except FileNotFoundError:
        instead = found_one_folder_down(base, path)
        if instead is None:
            raise FileToolError(f"no such file: {path!r}.{nearby(base, path)}") from None
        note = f"(there is no {path!r}: this is {instead}, read instead)"
        opened = base.open(instead)
    except Outside as exc:
        raise FileToolError(f"{exc}.{nearby(base, '.')}") from None
    with opened:
        if opened.is_dir:
            raise FileToolError(f"{path!r} is a directory; use list_files to list it")
        first = start_line or 1
        last = end_line if end_line is not None else first + MAX_READ_LINES - 1
        with opened.file() as handle:
            if looks_binary(handle.read(SNIFF_BYTES)):
                raise FileToolError(f"{path!r} is a binary file; only text files can be read")
            handle.seek(0)
            text = _page(handle, opened.rel, first, last, explicit_end=end_line is not None)
    if not note:
        return text
    header, _, lines = text.partition("\n")  # the header stays first: shorten_read reads it
    return f"{header}\n{note}\n{lines}" if lines else f"{header}\n{note}"


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
        return past_the_end(rel, first, number)
    last_shown = first + len(shown) - 1
    total, complete = _count_rest(handle, number, scanned)
    if complete and first == total > 1 and not explicit_end:
        return "\n".join([at_the_last_line(rel, total), *shown])
    header = f"{rel}: lines {first}-{last_shown} of {'' if complete else 'more than '}{total}"
    if budget_hit or (not explicit_end and last_shown < total):
        why = "the size limit for one read was reached; " if budget_hit else ""
        reads_on = next_read(rel, last_shown + 1)
        header += (
            f" (more remains: {why}if the question needs it, read the next part with {reads_on})"
        )
    elif complete and last_shown == total:
        header += f" ({END_OF_FILE})"
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
    start = _open(base, path, "no such file or directory")
    rules = IgnoreRules.for_walk(base, start.rel) if start.is_dir else None
    walk = Walk()
    matches: list[str] = []
    found_at: list[int] = []  # the matching lines' numbers
    first_data = b""  # the text of the file with the first match
    searched = files = 0
    complete = True
    with start, contextlib.closing(_files(base, start, walk, rules)) as found:
        for file in found:
            data = _search_text(file)
            if data is None:
                continue
            if files == MAX_SEARCH_FILES or searched + len(data) > MAX_SEARCH_TOTAL_BYTES:
                matches.append(
                    f"[stopped after searching {files} files ({searched} bytes), the limit for "
                    "one search; narrow the path to search the rest]"
                )
                complete = False
                break
            files += 1
            searched += len(data)
            before = len(found_at)
            if _collect(compiled, data, file.rel, matches, found_at):
                complete = False
                break
            if before == 0 and found_at:
                first_data = data
    if not matches:
        matches.append(f"no matches for {pattern!r} under {start.rel}")
    if len(found_at) == 1:  # one line is rarely the answer: a definition goes on below it
        matches += _lines_after(first_data, found_at[0])
    if found_at and complete and not walk.hard_links and not walk.too_deep:
        # A small model given the whole answer sent the same search again and again: say that
        # nothing more is to be found this way (issue 26).
        where = "the repository" if start.rel == "." else start.rel
        if rules is not None and rules.skipped.anything:
            where += " outside the folders and files named below"
        lines = "1 matching line" if len(found_at) == 1 else f"{len(found_at)} matching lines"
        matches.append(
            f"[the search is complete: these are all {lines} in {where}; the same search "
            "again finds the same lines]"
        )
    if walk.hard_links:
        matches.append(
            f"[{walk.hard_links} hard-linked file(s) not searched: a hard link may be a file "
            "outside the repository]"
        )
    if walk.too_deep:
        matches.append(
            f"[{walk.too_deep} folder(s) nested more than {MAX_WALK_DEPTH} deep not searched]"
        )
    note = rules.skipped.note("not searched", _search_call(pattern)) if rules else None
    if note:
        matches.append(note)
    return "\n".join(matches)


def _search_call(pattern: str) -> Callable[[str], str]:
    def call(rel: str) -> str:
        arguments = {"pattern": pattern, "path": rel}
        return f"search_files {json.dumps(arguments, ensure_ascii=False)}"

    return call


def _files(
    base: Root, start: Opened, walk: Walk, rules: IgnoreRules | None
) -> Generator[Opened, None, None]:
    if rules is not None:
        yield from base.walk(start, rules, walk)
    else:
        yield Opened(start.detach(), start.rel, start.st)


def _search_text(file: Opened) -> bytes | None:
    """The text of a file to search, or None for a binary or oversized file."""
    with file.file() as handle:
        data = handle.read(MAX_SEARCH_FILE_BYTES + 1)
    if len(data) > MAX_SEARCH_FILE_BYTES or looks_binary(data[:SNIFF_BYTES]):
        return None
    return data.replace(b"\r\n", b"\n")


def _lines_after(data: bytes, number: int) -> list[str]:
    """The `LINES_AFTER_ONE_MATCH` lines after line `number`, as they are in the file: with a
    ``path-N-`` prefix on each (``grep -A``'s form), the local model's answer copied the
    prefixes and lost the names."""
    end = number + LINES_AFTER_ONE_MATCH
    pieces = data.split(b"\n", end)  # the rest of the file, past `end`, stays in one piece
    lines = pieces[number:end]
    if len(pieces) <= end and lines and not lines[-1]:
        lines.pop()  # the file ended in the window: its last piece is the nothing after "\n"
    return [_shown_line(raw.rstrip(b"\r")) for raw in lines]


def _shown_line(raw: bytes) -> str:
    """A line of a file as a search shows it: decoded, and cut past `MAX_MATCH_LINE_CHARS`."""
    line = raw[: MAX_MATCH_LINE_CHARS * 4].decode("utf-8", errors="replace")
    if len(line) > MAX_MATCH_LINE_CHARS or len(raw) > MAX_MATCH_LINE_CHARS * 4:
        line = line[:MAX_MATCH_LINE_CHARS] + " [line cut]"
    return line


def _collect(
    compiled: Pattern, data: bytes, rel: str, matches: list[str], found_at: list[int]
) -> bool:
    """Add the matching lines of one file (and their numbers); True once the match cap is
    reached."""
    for number, raw in compiled.matching_lines(data):
        if len(matches) == MAX_SEARCH_MATCHES:
            matches.append(
                f"[stopped at {MAX_SEARCH_MATCHES} matches; narrow the pattern or the path]"
            )
            return True
        matches.append(f"{rel}:{number}: {_shown_line(raw)}")
        found_at.append(number)
    return False
