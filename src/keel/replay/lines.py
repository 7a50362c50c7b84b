"""A recording's text read with bounds: it comes from outside, so no line, gzip member or
JSON value may cost memory or time out of proportion (ADR 0049).

    MAX_LINE_CHARS   one line (one run) longer than this is skipped, its number named; its
                     rest is read past in pieces, never held whole
    MAX_FILE_CHARS   a file (gzip members decompressed) is read up to this much text; past it
                     the rest is skipped, said once: a gzip bomb costs a bounded time
    MAX_DEPTH        a JSON value nested deeper than this is skipped, its number named:
                     Python's parser and every recursive walk after it (call keys, the
                     loop's copies) would otherwise end in a RecursionError
    MAX_VALUES       a line (or a document) holding more JSON values than this is skipped
                     before it is parsed, its number named: `{}` is two characters and a
                     Python dict, so a cap on characters alone let 184 KB of gzip become
                     gigabytes (ADR 0062, RP-01). Counted as its `{`, `[` and `,`, an upper
                     bound of its values, in one pass at C speed

The longest line of the shared corpora is 16 KB and they nest 5 deep; a run of 300,000 turns
is about 30 MB on one line.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

__all__ = [
    "MAX_DEPTH",
    "MAX_FILE_CHARS",
    "MAX_LINE_CHARS",
    "MAX_VALUES",
    "Bounds",
    "Overlong",
    "TooBig",
    "TooDeep",
    "TooMany",
    "depth",
    "documents",
    "lines",
    "loads",
    "text",
]

MAX_LINE_CHARS = 64 * 1024 * 1024
MAX_FILE_CHARS = 1024 * 1024 * 1024
MAX_DEPTH = 100
MAX_VALUES = 4_000_000
"""About 13 values a turn for the 300,000 turns a 30 MB line holds; a few hundred MB parsed."""
_PIECE = 1024 * 1024
"""What is read at a time past the end of an overlong line."""


@dataclass(frozen=True, slots=True)
class Bounds:
    line: int = MAX_LINE_CHARS
    file: int = MAX_FILE_CHARS
    depth: int = MAX_DEPTH
    values: int = MAX_VALUES


@dataclass(frozen=True, slots=True)
class Overlong:
    """A line (or, read whole, a file) past its cap; what is left of the file past the file cap
    is one of these too, with `rest` set."""

    reason: str
    rest: bool = False


class TooBig(ValueError):
    """A JSON value past a cap: not parsed, or not kept."""


class TooDeep(TooBig):
    """A JSON value nested deeper than the cap."""


class TooMany(TooBig):
    """A JSON text holding more values than the cap."""


def lines(path: Path, bounds: Bounds) -> Generator[tuple[int, str | Overlong]]:
    """Non-blank lines with their 1-based numbers; an overlong line as `Overlong` in its place.
    Raises OSError/EOFError as the file does (a truncated gzip stream)."""
    with _open(path) as handle:
        number = read = 0
        while True:
            line = handle.readline(bounds.line + 1)
            if not line:
                return
            number += 1
            read += len(line)
            if len(line) > bounds.line and not line.endswith("\n"):
                while line and not line.endswith("\n") and read <= bounds.file:
                    line = handle.readline(_PIECE)
                    read += len(line)
                yield number, Overlong(f"the line is longer than {_size(bounds.line)}")
            elif line.strip():
                yield number, line
            if read > bounds.file:
                if handle.read(1):
                    reason = f"the file holds more than {_size(bounds.file)} of text"
                    yield number + 1, Overlong(f"{reason}; the rest of it was not read", True)
                return


def text(path: Path, bounds: Bounds) -> str | Overlong:
    """A whole file (a JSON document), or `Overlong` past the line cap."""
    with _open(path) as handle:
        whole = handle.read(bounds.line + 1)
    if len(whole) > bounds.line:
        return Overlong(f"the file is longer than {_size(bounds.line)}")
    return whole


def loads(raw: str, bounds: Bounds) -> Any:
    """`json.loads`, refusing a text of more values than the cap before parsing it (TooMany)
    and a value nested deeper than the cap (TooDeep); both are TooBig, a ValueError."""
    if raw.count("{") + raw.count("[") + raw.count(",") > bounds.values:
        raise TooMany(f"it holds more than {bounds.values:,} JSON values")
    try:
        data = json.loads(raw)
    except RecursionError:
        raise TooDeep(f"nested deeper than {bounds.depth} levels") from None
    if depth(data, bounds.depth) > bounds.depth:
        raise TooDeep(f"nested deeper than {bounds.depth} levels")
    return data


def documents(whole: str, bounds: Bounds) -> tuple[list[tuple[int, Any]], list[int]]:
    """The JSON values of a text that holds many, one after another and each over many lines
    (what OpenTelemetry's console exporter prints: each span indented, with a program's own
    output between them), with the line each starts on; and the lines that start no value
    (program output, a value cut short), passed over. Raises TooBig as `loads` does."""
    if whole.count("{") + whole.count("[") + whole.count(",") > bounds.values:
        raise TooMany(f"it holds more than {bounds.values:,} JSON values")
    decoder = json.JSONDecoder()
    found: list[tuple[int, Any]] = []
    passed: list[int] = []
    at, line = 0, 1
    while at < len(whole):
        end = whole.find("\n", at)
        end = len(whole) if end < 0 else end
        head = whole[at:end].strip()
        if head.startswith(("{", "[")):
            try:
                value, stop = decoder.raw_decode(whole, at + whole[at:end].index(head[0]))
            except RecursionError:
                raise TooDeep(f"nested deeper than {bounds.depth} levels") from None
            except ValueError:
                value, stop = None, -1
            if stop > 0:
                if depth(value, bounds.depth) > bounds.depth:
                    raise TooDeep(f"nested deeper than {bounds.depth} levels")
                found.append((line, value))
                line += whole.count("\n", at, stop)
                at = stop
                continue
        if head:
            passed.append(line)
        at, line = end + 1, line + 1
    return found, passed


def depth(value: Any, stop: int) -> int:
    """How deep lists and objects nest in `value` (a scalar: 0), walked without recursion;
    counting stops past `stop`."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, level)
        if deepest > stop:
            return deepest
        stack.extend((child, level + 1) for child in children if isinstance(child, dict | list))
    return deepest


def _open(path: Path) -> IO[str]:
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8", errors="replace")
    return path.open(encoding="utf-8", errors="replace")


def _size(chars: int) -> str:
    if chars >= 1024 * 1024 * 1024 and chars % (1024 * 1024 * 1024) == 0:
        return f"{chars // (1024 * 1024 * 1024)} GiB"
    if chars >= 1024 * 1024 and chars % (1024 * 1024) == 0:
        return f"{chars // (1024 * 1024)} MiB"
    return f"{chars:,} characters"
