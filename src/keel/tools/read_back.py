"""`read_result`: a result the run was shown elided, truncated or clamped, read back from its
record instead of fetched again (issue 44).

The context builder keeps a long run inside the model's window by replacing old results with
pointers, cutting results past the size cap and clamping a batch too large for the window. The
text itself is never lost: the run's record holds every result, and the whole text of a
truncated one. This tool pages through it by the result's citable id (`r7`): from an offset, a
bounded length, or only the lines a pattern matches. It reads the run's own results (a
follow-up's: its conversation's), is read-only, and its calls count as any call's do; reading an
elided result back is not a repeat of the call that produced it (a different call key), which
fetching it again with the original tool would be.

Patterns come from the model: they go to RE2 (keel/tools/search.py), linear in the text.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
from collections.abc import Callable

from keel.errors import ToolError
from keel.tools.base import Effect, Tool, make_tool
from keel.tools.search import compile_pattern

__all__ = ["DEFAULT_LENGTH", "MAX_MATCHES", "READ_BACK_NAME", "read_back_tool"]

READ_BACK_NAME = "read_result"
DEFAULT_LENGTH = 4000
"""Characters one read returns unless it asks for fewer (never more than the run's cap)."""
MAX_MATCHES = 40
"""Lines a pattern read returns at most; the rest are counted, and paged with `offset`."""
_LINE_CHARS = 300
"""Characters of one matching line shown."""


def _read_result(
    id: str, offset: int = 0, length: int = DEFAULT_LENGTH, pattern: str | None = None
) -> str:
    """Read back an earlier tool result by the id it begins with (r7), instead of calling
    its tool again: `length` characters of its whole text from `offset`; with `pattern`
    (a regular expression), only its matching lines from `offset` on, with their offsets."""
    raise AssertionError("the template's function: read_back_tool binds one to a run")


@functools.cache
def _template() -> Tool:
    """The tool's name, description and argument model, made once per process: a pydantic
    model per run would cost every run's start (benchmarks/startup.py)."""
    return make_tool(_read_result, name=READ_BACK_NAME, effect=Effect.READ_ONLY)


def read_back_tool(find: Callable[[str], str | None], max_chars: int) -> Tool:
    """The tool over one run's results: `find(ref)` is a result's whole text, or None for an
    id the run does not have; `max_chars` bounds what one call returns."""
    cap = max(200, max_chars - 200)  # its own header too stays under the run's cap

    def read_result(
        id: str, offset: int = 0, length: int = DEFAULT_LENGTH, pattern: str | None = None
    ) -> str:
        ref = id.strip().strip("[]")
        text = find(ref)
        if text is None:
            raise ToolError(f"this run has no result {ref!r}; ids look like r1, r2, ...")
        if offset < 0 or offset > len(text):
            raise ToolError(f"offset {offset} is outside {ref} (0 to {len(text)})")
        if length < 1:
            raise ToolError("length must be at least 1")
        if pattern:
            return _matches(ref, text, offset, pattern, cap)
        end = min(len(text), offset + min(length, cap))
        header = f"[{ref}: characters {offset}-{end} of {len(text)}"
        if end < len(text):
            header += f'; next: read_result(id="{ref}", offset={end})'
        return f"{header}]\n{text[offset:end]}"

    return dataclasses.replace(_template(), fn=read_result)


def _matches(ref: str, text: str, offset: int, pattern: str, cap: int) -> str:
    compiled = compile_pattern(pattern)  # refused with a message the model can act on
    starts = _line_starts(text)
    data = text[offset:].encode("utf-8")
    first_line = _line_of(starts, offset)
    found: list[str] = []
    total = used = 0
    for number, line in compiled.matching_lines(data):
        total += 1
        index = first_line + number - 2
        at = max(offset, starts[index] if index < len(starts) else offset)
        hit = compiled.first_match(line) or 0
        before = len(line[:hit].decode("utf-8", errors="replace"))
        text_line = line.decode("utf-8", errors="replace")
        start = max(0, before - _LINE_CHARS // 3)  # a long line is shown around its match
        shown = text_line[start : start + _LINE_CHARS]
        entry = f"{at + before}: {'…' if start else ''}{shown}"
        if len(found) < MAX_MATCHES and used + len(entry) <= cap:
            found.append(entry)
            used += len(entry) + 1
    if not found:
        return f"[{ref}: no line from offset {offset} on matches {pattern!r}]"
    left = total - len(found)
    more = f"; {left} more, read on with a larger offset" if left else ""
    head = f"[{ref}: {total} line(s) from offset {offset} on match {pattern!r}, by the offset of "
    head += f"their match{more}]"
    return head + "\n" + "\n".join(found)


def _line_starts(text: str) -> list[int]:
    starts, at = [0], 0
    for line in text.splitlines(keepends=True):
        at += len(line)
        starts.append(at)
    return starts


def _line_of(starts: list[int], offset: int) -> int:
    """The 1-based line that character `offset` falls in."""
    return bisect.bisect_right(starts, offset)
