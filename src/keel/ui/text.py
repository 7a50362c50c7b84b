"""Text shown in the web view: untrusted (tool results, answers, page text, arguments), so it is
cleaned before the template escapes it, and sized for a page.

Escaping is the templates' job (Jinja autoescape is on for every page, fragment and chart), so a
result holding `<script>` is shown as text. Cleaning is the other half: terminal control
sequences (ANSI colours, cursor moves, OSC titles and links), the remaining C0 and C1 control
characters, and the bidirectional overrides that can make text read differently from what it
is. Newlines and tabs stay.
"""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime
from typing import Any

__all__ = [
    "age",
    "clean",
    "clip",
    "pretty_json",
    "short",
    "size",
    "target_first",
    "utc",
]

_ESCAPE_SEQUENCE = re.compile(
    r"\x1b(?:"
    r"\[[0-?]*[ -/]*[@-~]"  # CSI: colours, cursor moves, erase
    r"|\][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC: window titles, hyperlinks
    r"|[PX^_][^\x1b]*(?:\x1b\\)?"  # DCS, SOS, PM, APC strings
    r"|[ -/]*[0-~]"  # two- and three-character escapes
    r")?"
)
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def clean(value: object) -> str:
    """The text without control sequences or control characters (newlines and tabs kept)."""
    text = value if isinstance(value, str) else "" if value is None else str(value)
    if not text.isprintable():
        text = _CONTROL.sub("", _ESCAPE_SEQUENCE.sub("", text))
    return text


def clip(value: object, limit: int = 2_000) -> str:
    """Cleaned, and at most `limit` characters, saying how much was left out."""
    text = clean(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit:,} more characters)"


def short(value: object, limit: int = 60) -> str:
    """Cleaned, and cut to `limit` characters with an ellipsis: for table cells."""
    text = clean(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def pretty_json(value: Any) -> str:
    """Arguments as indented JSON (a string that was not JSON is shown as it was written)."""
    if isinstance(value, str):
        return clean(value)
    return clean(json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False))


_TARGETS = ("path", "url", "target", "file", "selector", "query")


def target_first(arguments: Any) -> Any:
    """Arguments with what a call acts on first, so a person approving it reads that first."""
    if not isinstance(arguments, dict):
        return arguments
    first = [k for k in _TARGETS if k in arguments]
    return {k: arguments[k] for k in [*first, *(k for k in arguments if k not in first)]}


def size(chars: int) -> str:
    if chars >= 1_000_000:
        return f"{chars / 1_000_000:.1f} M chars"
    if chars >= 1_000:
        return f"{chars / 1_000:.1f} k chars"
    return f"{chars} chars"


def age(at: float, now: float | None = None) -> str:
    seconds = max(0.0, (time.time() if now is None else now) - at)
    for unit, span in (("d", 86_400), ("h", 3_600), ("min", 60)):
        if seconds >= span:
            return f"{int(seconds // span)} {unit} ago"
    return f"{int(seconds)} s ago"


def utc(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
