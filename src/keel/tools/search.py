"""Matching a model-chosen regular expression without letting it run away.

Python's `re` backtracks: ``(a+)+b`` over forty ``a`` takes longer than any run has, and it
holds the GIL all the while, so neither the tool timeout, the run's deadline nor SIGTERM gets a
turn. Patterns therefore go to RE2 (the `google-re2` package), whose matching time is linear in
the text, with no backtracking to blow up; the syntax is Python's minus backreferences and
lookaround (ADR 0014). Patterns are matched one line at a time, as grep does: the whole buffer
is scanned in one call with ``never_nl`` set, so a match never spans a newline, and ``^``/``$``
mark line starts and ends.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from keel.tools.fileio import FileToolError

__all__ = ["Pattern", "compile_pattern"]

MAX_PATTERN_CHARS = 2000
_PROGRAM_MEMORY = 16 << 20
"""RE2 refuses a pattern whose compiled program would need more (``a{1000}{1000}``, say)."""


class Pattern:
    """A compiled pattern that finds the lines of a text it matches."""

    def __init__(self, text: str, compiled: Any) -> None:
        self.text = text
        self._compiled = compiled

    def matching_lines(self, data: bytes) -> Iterator[tuple[int, bytes]]:
        """(line number, line) for each line of `data` the pattern matches, in order."""
        pos, number, counted_to = 0, 1, 0
        while pos < len(data):
            match = self._compiled.search(data, pos)
            if match is None:
                return
            start = match.start()
            newline = data.rfind(b"\n", pos, start)
            line_start = pos if newline < 0 else newline + 1
            number += data.count(b"\n", counted_to, line_start)
            counted_to = line_start
            line_end = data.find(b"\n", start)
            if line_end < 0:
                line_end = len(data)
            yield number, data[line_start:line_end]
            pos = line_end + 1

    def first_match(self, line: bytes) -> int | None:
        """Where in `line` the pattern first matches (a byte offset), or None."""
        match = self._compiled.search(line, 0)
        return None if match is None else int(match.start())


def compile_pattern(pattern: str) -> Pattern:
    """Compile an untrusted pattern, or refuse it with a message the model can act on."""
    if len(pattern) > MAX_PATTERN_CHARS:
        raise FileToolError(
            f"the pattern is {len(pattern)} characters; the limit is {MAX_PATTERN_CHARS}"
        )
    import re2  # on a search's first pattern: the binding costs every start ~3 ms (ADR 0042)

    options = re2.Options()
    options.log_errors = False  # RE2 would print parse errors on the process's stderr
    options.never_nl = True
    options.max_mem = _PROGRAM_MEMORY
    try:
        compiled = re2.compile(b"(?m)" + pattern.encode("utf-8"), options=options)
    except UnicodeEncodeError:
        raise FileToolError(f"the pattern {pattern!r} is not valid Unicode text") from None
    except re2.error as exc:
        detail = exc.args[0] if exc.args else exc
        if isinstance(detail, bytes):
            detail = detail.decode("utf-8", errors="replace")
        raise FileToolError(
            f"invalid regular expression {pattern!r}: {detail}. Patterns use RE2 syntax: "
            "Python's re without backreferences or lookaround, matched one line at a time"
        ) from None
    return Pattern(pattern, compiled)
