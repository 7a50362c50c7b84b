"""Recordings from Claude Code sessions: the JSON lines it keeps per session
(`~/.claude/projects/<project>/<session>.jsonl`), or what `claude -p --output-format
stream-json` prints, which has the same `assistant` and `user` lines.

    assistant   `message.content` holds `tool_use` blocks (`id`, `name`, `input`); the blocks
                of one model response share `message.id` (Claude Code writes a line per block),
                so the lines with one id are one turn
    user        `message.content` holds `tool_result` blocks (`tool_use_id`, `content` as text
                or text parts, `is_error`)

Every other line (summaries, snapshots, system lines) is passed over, and so are sidechain
lines (`isSidechain`: a sub-agent's own loop, not this session's). One recording per
`sessionId`, in the order they first appear. A tool's kind comes from Claude Code's tool names
(`Read`, `Grep` read; `Edit`, `Write` write; `Bash` runs), so `--effects kind` sees its reads.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from keel.informative import says_nothing
from keel.replay.lines import Bounds
from keel.replay.recorded import (
    WRONG,
    Recorded,
    Recording,
    Skipped,
    content_text,
    digest,
    parse_arguments,
)

__all__ = ["is_entry", "read_entries"]

ENTRY_TYPES = ("user", "assistant", "system", "summary", "result", "file-history-snapshot")
"""The `type` of a Claude Code session line; a first line of one of these picks this reader."""

KINDS = {
    "Read": "read",
    "Grep": "read",
    "Glob": "read",
    "LS": "read",
    "WebFetch": "read",
    "WebSearch": "read",
    "NotebookRead": "read",
    "BashOutput": "read",
    "Edit": "write",
    "MultiEdit": "write",
    "Write": "write",
    "NotebookEdit": "write",
    "Bash": "run",
}


@dataclass(slots=True)
class _Session:
    model: str = ""
    turns: list[tuple[str, list[tuple[str, str, Any]]]] = field(default_factory=list)
    """Each turn's message id and its calls (tool_use id, tool name, arguments)."""
    results: dict[str, tuple[str, bool, bool, int]] = field(default_factory=dict)
    """A tool_use id's result: digest, empty, error, characters."""


def is_entry(data: Any) -> bool:
    """Whether a parsed line looks like a Claude Code session line."""
    if not isinstance(data, dict) or "turns" in data or "messages" in data:
        return False
    if "sessionId" in data or "leafUuid" in data:
        return True
    if data.get("type") == "file-history-snapshot" and ("snapshot" in data or "messageId" in data):
        return True  # Claude Code 2.1.x opens a session with one (ADR 0064)
    return data.get("type") in ENTRY_TYPES and isinstance(data.get("message"), dict)


def read_entries(
    values: Iterable[tuple[str, Any]], skipped: list[Skipped], bounds: Bounds
) -> Iterator[Recording]:
    """One recording per session, from the parsed lines in `values` (where, parsed JSON)."""
    sessions: dict[str, _Session] = {}
    where = ""
    for where, entry in values:
        if not isinstance(entry, dict):
            skipped.append(Skipped(where, "not a Claude Code session line (not an object)"))
            continue
        message = entry.get("message")
        if entry.get("isSidechain") is True or not isinstance(message, dict):
            continue
        name = str(entry.get("sessionId") or entry.get("session_id") or "claude-code")
        session = sessions.setdefault(name, _Session())
        content = message.get("content")
        if not isinstance(content, list):
            continue
        if entry.get("type") == "assistant":
            _assistant(session, message, content, where, skipped, bounds)
        elif entry.get("type") == "user":
            _results(session, content)
    for name, session in sessions.items():
        turns = []
        for _, calls in session.turns:
            recorded = []
            for use_id, tool, arguments in calls:
                found = session.results.get(use_id)
                result, empty, error, chars = found or (None, False, False, None)
                recorded.append(
                    Recorded(
                        tool,
                        arguments,
                        result,
                        kind=KINDS.get(tool),
                        empty=empty,
                        error=error,
                        chars=chars,
                    )
                )
            turns.append(tuple(recorded))
        if turns:
            yield Recording(id=name, turns=tuple(turns), corpus="claude-code", model=session.model)
    if where and not any(session.turns for session in sessions.values()):
        skipped.append(Skipped(where, "no Claude Code tool calls in it"))


def _assistant(
    session: _Session,
    message: dict[str, Any],
    content: list[Any],
    where: str,
    skipped: list[Skipped],
    bounds: Bounds,
) -> None:
    uses = [b for b in content if isinstance(b, dict) and b.get("type") == "tool_use"]
    if not uses:
        return
    session.model = session.model or str(message.get("model") or "")
    response = str(message.get("id") or where)
    if not session.turns or session.turns[-1][0] != response:
        session.turns.append((response, []))
    calls = session.turns[-1][1]
    for block in uses:
        if not isinstance(block.get("name"), str):
            skipped.append(Skipped(where, "a tool_use block without a tool name (left out)"))
            continue
        arguments = parse_arguments(block.get("input"), bounds)
        if arguments is WRONG:
            skipped.append(Skipped(where, f"the input of {block['name']!r} is not an object"))
            continue
        calls.append((str(block.get("id") or f"{where}#{len(calls)}"), block["name"], arguments))


def _results(session: _Session, content: list[Any]) -> None:
    for block in content:
        if isinstance(block, dict) and block.get("type") == "tool_result":
            text = content_text(block.get("content"))
            answer = (digest(text), says_nothing(text), block.get("is_error") is True, len(text))
            session.results[str(block.get("tool_use_id"))] = answer
