"""The shape every recording reader produces (`Recording`, one `Recorded` per call, `Skipped`
for what could not be read), and the small helpers the readers share: a result's digest, the
text of a content value, a call's arguments parsed with the nesting cap.

Apart from `keel.replay.recordings` so the per-format readers (`keel.replay.otel`,
`keel.replay.claude_code`, `keel.replay.openhands`) can use them while `recordings` picks
among the readers.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from keel.replay.lines import Bounds, TooBig, loads

__all__ = [
    "WRONG",
    "Recorded",
    "Recording",
    "Skipped",
    "content_text",
    "digest",
    "parse_arguments",
    "size",
    "unreadable_arguments",
]


@dataclass(frozen=True, slots=True)
class Recorded:
    """One recorded tool call and what it got back."""

    tool: str
    arguments: Any
    result: str | None
    """A digest (or the text) of the result; None where the recording has none."""
    kind: str | None = None
    """read, nav, run, write, submit or other, where the recording says so."""
    source_write: bool = False
    effect: str | None = None
    """The effect Keel's own record declares (read_only, side_effecting, observation)."""
    empty: bool = False
    """The result says nothing (empty, an exit status alone, a fixed success line:
    `keel.informative`), where the recording holds its text or says it was empty: the
    repeat tiers never chain on it (ADR 0064)."""
    error: bool = False
    """The call failed (an error result), where the recording says so."""
    chars: int | None = None
    """Characters in the result, where the recording says so or holds its text: what the
    window check (`keel.replay.window`) sizes the run's requests from."""


@dataclass(frozen=True, slots=True)
class Recording:
    id: str
    turns: tuple[tuple[Recorded, ...], ...]
    corpus: str = ""
    model: str = ""
    resolved: bool | None = None
    """Whether the run's outcome was judged right, where the source says so."""
    question_chars: int = 0
    """Characters of what the run opened with (the question, and the system text where the
    recording holds it); 0 where it holds neither."""
    texts: tuple[int, ...] = ()
    """Characters of the model's own text in each turn, where the recording holds it (one per
    turn); empty where it does not."""


@dataclass(frozen=True, slots=True)
class Skipped:
    """A line or record that could not be read, and why."""

    where: str
    reason: str


WRONG: Any = object()
"""What `parse_arguments` returns for arguments of a type no call can have."""


def unreadable_arguments(where: str, place: str, tool: str, bounds: Bounds) -> Skipped:
    """What is reported for a call whose arguments `parse_arguments` found WRONG."""
    return Skipped(
        where,
        f"{place}: the arguments of {tool!r} are neither JSON text nor an object, "
        f"or nest deeper than {bounds.depth} levels",
    )


def parse_arguments(raw: Any, bounds: Bounds) -> Any:
    """A call's arguments: JSON text parsed (text that is not JSON kept as it is, so the call
    key keeps it), an object as it is, none as {}; anything else, or JSON nested past the cap,
    is `WRONG`."""
    if raw is None or raw == "":
        return {}
    if isinstance(raw, dict):
        return raw
    if not isinstance(raw, str):
        return WRONG
    try:
        return loads(raw, bounds)
    except TooBig:
        return WRONG
    except ValueError:
        return raw


def content_text(content: Any) -> str:
    """A message or result content as text: a string as it is, a list of parts by their
    `text`, anything else as its `str` (None as nothing)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


def size(value: Any) -> int | None:
    """A recorded size: a count of characters, or None for anything else (a bool, a negative
    number, text)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def digest(text: str) -> str:
    """The first 16 hex digits of the text's sha256: equal results, equal digests."""
    return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:16]
