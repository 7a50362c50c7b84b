"""What the file tools say so that a model can go on (issue 26, ADR 0036).

A small model does what a result tells it and little else: a read cut short that does not name
the call reading the rest is read again from the top, and a missing path that does not say what
exists is guessed again. So:

- `next_read` is the exact call that reads on, as the model would write it
  (``read_file {"path": "src/x.py", "start_line": 228}``);
- `shorten_read` cuts a `read_file` result that is longer than the run's result cap after the
  last whole line that fits, and rewrites its header to say which lines it shows and which call
  reads the next part (the executor's own cut would end mid-line, under a header claiming the
  whole file);
- a read that reaches the end says so, and a read at the last line or past the end answers in
  one unmistakable sentence that the file has been read and the answer is due
  (`at_the_last_line`, `past_the_end`): after reading a file to its end, the local model asked
  for its last line three more times while the header only said ``lines 246-246 of 246``, then
  ``(the end of the file: nothing more to read)``, and the run ended in a synthesis turn;
- `found_one_folder_down` finds the one file a path names when a folder was left out in front
  of it: the local model asked for ``/keel/_run/loop.py`` four times in a row when the question
  said ``src/keel/_run/loop.py``, though each error named the right call; `read_file` reads
  that file instead, and its header says which file it is;
- `nearby` names the deepest folder of a missing or refused path that does exist, what it
  holds, and the names closest to the one that was not there.
"""

from __future__ import annotations

import difflib
import json
import re
import stat
from pathlib import PurePosixPath
from typing import Any

from keel.tools.confine import Root
from keel.tools.fileio import FileToolError

__all__ = [
    "END_OF_FILE",
    "at_the_last_line",
    "found_one_folder_down",
    "nearby",
    "next_read",
    "past_the_end",
    "shorten_read",
]

_HEADER = re.compile(r"^(?P<rel>.*): lines (?P<first>\d+)-(?P<last>\d+) of (?P<total>[^(]*\d)")
_NUMBERED = re.compile(r"^\s*(\d+)\t")
_SHOWN_ENTRIES = 12
_LOOKED_INTO = 50
"""Folders `nearby` looks into for the missing part of a path."""
_HEADER_ROOM = 300
"""Characters kept free for the rewritten header within the cap."""


END_OF_FILE = "the end of the file: nothing more to read; answer the question from what you read"
_READ_IT_ALL = "you have read all of it: answer the question now, from what you read"


def at_the_last_line(rel: str, total: int) -> str:
    """The header of a read that starts at a file's last line (a model asking for what comes
    after the end it was already shown)."""
    return f"{rel}: line {total} is its last line; nothing follows it: {_READ_IT_ALL}"


def past_the_end(rel: str, start_line: int, total: int) -> str:
    """The whole answer to a read that starts after a file's last line."""
    return f"line {start_line} is past the end of {rel} ({total} lines); {_READ_IT_ALL}"


def next_read(rel: str, start_line: int | None = None, end_line: int | None = None) -> str:
    """The call that reads a file (on from `start_line`), in the form the model sends calls."""
    arguments: dict[str, Any] = {"path": rel}
    if start_line is not None:
        arguments["start_line"] = start_line
    if end_line is not None:
        arguments["end_line"] = end_line
    return f"read_file {json.dumps(arguments, ensure_ascii=False)}"


def shorten_read(arguments: dict[str, Any], full: str, limit: int) -> str | None:
    """`full` (a read_file result) cut to at most about `limit` characters after a whole line,
    under a header naming the lines shown and the call that reads the next part; None when not
    even one numbered line fits (the executor then cuts it plainly)."""
    header, _, body = full.partition("\n")
    found = _HEADER.match(header)
    if found is None:
        return None
    kept: list[str] = []
    used = 0
    last = None
    for line in body.split("\n"):
        if used + len(line) + 1 > limit - _HEADER_ROOM:
            break
        kept.append(line)
        used += len(line) + 1
        numbered = _NUMBERED.match(line)
        if numbered:
            last = int(numbered.group(1))
    if last is None:
        return None
    rel, first, total = found["rel"], found["first"], found["total"]
    end = arguments.get("end_line")
    reads_on = next_read(rel, last + 1, end if isinstance(end, int) and end > last else None)
    head = (
        f"{rel}: lines {first}-{last} of {total} (the rest did not fit in one result; "
        f"if the question needs it, read the next part with {reads_on})"
    )
    return "\n".join([head, *kept])


def nearby(base: Root, requested: str) -> str:
    """What exists near a path that does not: the deepest folder of it that does, with its
    entries and the names closest to the missing one. Empty when nothing useful can be said."""
    try:
        names = [n for n in base.components(requested, slash_is_root=True) if n not in ("", ".")]
    except FileToolError:
        return ""
    if ".." in names:
        names = []
    for depth in range(len(names), -1, -1):
        folder = "/".join(names[:depth]) or "."
        entries = _entries(base, folder)
        if entries is None:
            continue
        missing = names[depth] if depth < len(names) else ""
        found = _one_level_down(base, folder, entries, names[depth:]) if missing else None
        return _describe(folder, entries, missing) + (f" It is: {found}" if found else "")
    return ""


def found_one_folder_down(base: Root, requested: str) -> str | None:
    """The path of the one regular file that exists when a single folder is put in front of
    the missing part of `requested`; None when there is none, or more than one."""
    try:
        names = [n for n in base.components(requested, slash_is_root=True) if n not in ("", ".")]
    except FileToolError:
        return None
    if not names or ".." in names:
        return None
    for depth in range(len(names) - 1, -1, -1):
        folder = "/".join(names[:depth]) or "."
        entries = _entries(base, folder)
        if entries is None:
            continue
        found = []
        for entry in entries[:_LOOKED_INTO]:
            if not entry.endswith("/"):
                continue
            parts = ([] if folder == "." else [folder]) + [entry.rstrip("/"), *names[depth:]]
            candidate = "/".join(parts)
            try:
                st = base.lookup(candidate)
            except (FileNotFoundError, FileToolError, OSError):
                continue
            if stat.S_ISREG(st.st_mode):
                found.append(candidate)
        return found[0] if len(found) == 1 else None
    return None


def _one_level_down(base: Root, folder: str, entries: list[str], rest: list[str]) -> str | None:
    """The call that reads (or lists) the path that exists when one folder is put in front of
    the missing part (a model that drops the leading "src/" is common), or None."""
    for entry in entries[:_LOOKED_INTO]:
        if not entry.endswith("/"):
            continue
        candidate = "/".join(([] if folder == "." else [folder]) + [entry.rstrip("/"), *rest])
        try:
            st = base.lookup(candidate)
        except (FileNotFoundError, FileToolError, OSError):
            continue
        if stat.S_ISDIR(st.st_mode):
            return f"list_files {json.dumps({'path': candidate}, ensure_ascii=False)}"
        return next_read(candidate)
    return None


def _entries(base: Root, folder: str) -> list[str] | None:
    try:
        opened = base.open(folder)
    except (FileNotFoundError, FileToolError, OSError):
        return None
    with opened:
        if not opened.is_dir:
            return None
        listed = base.entries(opened)
    named = [name + ("/" if stat.S_ISDIR(st.st_mode) else "") for name, st in listed]
    shown = [n for n in named if not n.startswith(".")]
    hidden = [n for n in named if n.startswith(".") and n.rstrip("/") != ".git"]
    return shown + hidden  # dot-files last, .git never


def _describe(folder: str, entries: list[str], missing: str) -> str:
    where = "the repository's top folder" if folder == "." else f"the folder {folder}"
    if not entries:
        return f" {where[0].upper()}{where[1:]} exists and is empty."
    shown = ", ".join(entries[:_SHOWN_ENTRIES])
    more = f" and {len(entries) - _SHOWN_ENTRIES} more" if len(entries) > _SHOWN_ENTRIES else ""
    text = f" {where[0].upper()}{where[1:]} exists and holds: {shown}{more}."
    plain = [e.rstrip("/") for e in entries]
    close = difflib.get_close_matches(missing, plain, n=3, cutoff=0.6) if missing else []
    if close:
        paths = [str(PurePosixPath(folder) / c) if folder != "." else c for c in close]
        text += f" Closest to {missing!r}: {', '.join(paths)}."
    return text
