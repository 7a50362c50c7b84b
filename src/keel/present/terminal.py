"""Text for a person at a terminal: untrusted text made inert, and calls shown readably.

Answers, tool results, questions and arguments come from models, pages and files. Printed raw,
an escape sequence can write the clipboard (OSC 52), plant a link whose text lies (OSC 8), move
the cursor over what was printed, or reverse the reading order (bidi overrides). `safe_text`
removes escape sequences whole and replaces any other control character, so what a person reads
is what is there. JSON output is never passed through it: it stays exact.

`describe_call` shows a pending call the way an approver needs it: the tool, then its target
(the path, URL or recipient) first, then every other argument; long values are folded with a
note of how much was left out, never cut silently.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["describe_call", "fold", "safe_text"]

_ESCAPE_SEQUENCES = re.compile(
    r"""
      \x1b\[[0-?]*[ -/]*[@-~]              # CSI: colours, cursor moves
    | \x9b[0-?]*[ -/]*[@-~]                # CSI, 8-bit form
    | [\x1b\x9d]\].*?(?:\x07|\x1b\\|\x9c)  # OSC: clipboard (52), hyperlinks (8), titles
    | \x1b\].*\Z                           # an OSC left open
    | [\x1b][PX^_].*?(?:\x1b\\|\x9c)       # DCS, SOS, PM, APC strings
    | [\x90\x98\x9e\x9f].*?(?:\x1b\\|\x9c)  # the same, 8-bit form
    | \x1b[ -/]*[0-~]?                     # any other escape
    """,
    re.VERBOSE | re.DOTALL,
)
_CONTROLS = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]"
)
"""C0 and C1 controls except tab and newline, DEL, and the bidirectional overrides."""

TARGET_FIRST = ("path", "url", "file", "to", "target", "command", "query")
"""Arguments an approver must see first: what the call acts on."""

_LINES_SHOWN = 8
_CHARS_SHOWN = 240


def safe_text(text: str) -> str:
    """`text` without escape sequences and with other control characters replaced by U+FFFD."""
    if text.isprintable():
        return text
    return _CONTROLS.sub("\ufffd", _ESCAPE_SEQUENCES.sub("", text))


def fold(text: str, *, lines: int = _LINES_SHOWN, chars: int = _CHARS_SHOWN) -> str:
    """The head of a long value and a note of what was left out."""
    head = text.split("\n")
    shown = "\n".join(head[:lines])
    more = []
    if len(head) > lines:
        more.append(f"+{len(head) - lines} more lines")
    if len(shown) > chars:
        more.append(f"+{len(shown) - chars} more characters")
        shown = shown[:chars]
    if not more:
        return shown
    return f"{shown}… ({', '.join(more)}; {len(text)} characters in all)"


def describe_call(name: str, arguments: Any) -> list[str]:
    """Lines describing a call for a person: the tool, then each argument, target first."""
    lines = [safe_text(name)]
    if not isinstance(arguments, dict):
        text = arguments if isinstance(arguments, str) else json.dumps(arguments)
        return [*lines, "  (arguments that are not a JSON object)", _indent(fold(text))]
    order = sorted(arguments, key=lambda k: (TARGET_FIRST.index(k) if k in TARGET_FIRST else 99, k))
    for key in order:
        value = arguments[key]
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        shown = safe_text(fold(text))
        if "\n" in shown:
            lines.append(f"  {safe_text(str(key))}:")
            lines.append(_indent(shown, "    "))
        else:
            lines.append(f"  {safe_text(str(key))}: {shown}")
    return lines


def _indent(text: str, prefix: str = "  ") -> str:
    return "\n".join(prefix + line for line in text.split("\n"))
