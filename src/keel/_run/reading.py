"""Read what the search found (issue 51): while a run that insists on evidence
(`Limits.first_turn_tool`) has searched, found lines, and read no file, its next turn must call
a tool, and its control names the read of the file the search found most often, around the
first line found there.

Measured on SWE-QA's questions (docs/adr/0068): the embedded model made one search and answered
from the matching lines, the single lines of a grep, and named functions it had never seen. A
small model follows a call it is shown (issue 26), so the control shows one. The rule reads only
the run's own results, never the question's words; it stops at the first file read, and it
never turns a synthesis turn into one that calls tools.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Collection, Sequence

from keel._run.synthesis import Mode
from keel.messages import ToolResult

__all__ = ["LINES_BEFORE", "LINES_READ", "READ_FOUND_CONTROL", "read_found_call", "read_found_mode"]

LINES_BEFORE = 5
LINES_READ = 40
"""Lines the named read shows: about 600 tokens, a function and what is around it, in an 8k
window that also holds the search."""
READ_FOUND_CONTROL = (
    "Before you answer, read the code your search found: the lines of a search are not the "
    "code around them."
)
_MATCH = re.compile(r"^(?:\[r\d+\]\s*)?([^\s:\[][^:\n]*):(\d+): ", re.M)


def read_found_call(
    results: Sequence[tuple[str, ToolResult]], tools: Collection[str]
) -> str | None:
    """The read to name, or None: no search found lines yet, or a file was read already."""
    if "read_file" not in tools or any(
        r.name == "read_file" and not r.is_error for _, r in results
    ):
        return None
    for _, result in reversed(results):
        if result.name != "search_files" or result.is_error:
            continue
        found = [(m.group(1), int(m.group(2))) for m in _MATCH.finditer(result.content)]
        if not found:
            continue
        counts = Counter(path for path, _ in found)
        path = max(counts, key=lambda p: (counts[p], -[f for f, _ in found].index(p)))
        line = next(n for p, n in found if p == path)
        start = max(1, line - LINES_BEFORE)
        arguments = {"path": path, "start_line": start, "end_line": start + LINES_READ - 1}
        return f"read_file {json.dumps(arguments, ensure_ascii=False)}"
    return None


def read_found_mode(
    results: Sequence[tuple[str, ToolResult]], tools: Collection[str]
) -> Mode | None:
    """The turn that reads what the search found, or None when the rule does not apply."""
    call = read_found_call(results, tools)
    if call is None:
        return None
    return Mode(controls=(f"{READ_FOUND_CONTROL} Here that is: {call}",), tool_required=True)
