"""Recordings from SWE-agent's `.traj` files and mini-swe-agent's `.traj.json` files, read as
what they are (before ADR 0064 a `.traj` was taken for an OpenHands log, since it has a
`history`, and replayed as a run of no turns).

    SWE-agent       `{"trajectory": [{"action", "observation", ...}], "history": [...],
                    "info": {"exit_status", "model_stats", ...}}`: each step is one turn of
                    one call, the action text its command, the observation its result
    mini-swe-agent  `{"info": {"mini_version", "exit_status", ...}, "messages": [...],
                    "trajectory_format": "mini-swe-agent-..."}`: each assistant message's
                    bash block is one call, the next user message (its
                    `<returncode>`/`<output>` observation) its result; a message's own
                    `tool_calls` (its tool-calling models) are read as chat calls are

A command's tool is its first word when that is one of SWE-agent's own commands (`open`,
`edit`, `find_file`, `str_replace_editor`, ...), else `bash`; its arguments `{"command":
TEXT}`, as the shared trajectories write them, so a replay keys them alike. The kind follows
the command (`open`, `goto`, `find_file` read; `edit`, `create`, `sed -i` write; `submit`
submits; other shell commands run). Neither format records whether the run was resolved: the
benchmark's report says so (`keel replay --resolved`).
"""

from __future__ import annotations

import re
from typing import Any

from keel.informative import says_nothing
from keel.replay.recorded import Recorded, Recording, Skipped, content_text, digest

__all__ = ["from_mini", "from_traj", "is_mini", "is_traj"]

COMMANDS = {
    "open": "read",
    "goto": "nav",
    "scroll_up": "nav",
    "scroll_down": "nav",
    "find_file": "read",
    "search_dir": "read",
    "search_file": "read",
    "filemap": "read",
    "create": "write",
    "edit": "write",
    "insert": "write",
    "str_replace_editor": "write",
    "submit": "submit",
}
"""SWE-agent's own commands (its default tools, 0.x and 1.x) and their kinds."""
_READS = re.compile(
    r"^(?:cd \S+ && )?(?:ls|cat|nl|head|tail|grep|rg|find|wc|pwd|tree|git (?:diff|status|log|show)"
    r"|sed -n)\b"
)
_WRITES = re.compile(r"\bsed -i\b|^(?:cat|echo|printf)\b.*>|\b(?:mkdir|mv|cp|rm|touch|patch)\b")
_BASH_BLOCK = re.compile(r"```(?:bash|sh|mswea_bash_command)\s*\n(.*?)\n?```", re.DOTALL)
_SUBMIT = ("COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT", "MINI_SWE_AGENT_FINAL_OUTPUT")
_PATH = re.compile(r"(?:\[File: )?((?:/|\.{0,2}/)?[\w.-]+(?:/[\w.-]+)*\.\w+)")
_NOT_SOURCE = re.compile(
    r"(?:^|/)(?:tests?|testing|repro\w*|reproduce\w*|scratch|debug\w*|tmp)(?:/|_|\.|$)"
)


def is_traj(data: Any) -> bool:
    """Whether a parsed document is a SWE-agent `.traj`: a `trajectory` list of steps with an
    `action`."""
    if not isinstance(data, dict) or not isinstance(data.get("trajectory"), list):
        return False
    steps = data["trajectory"]
    return not steps or (isinstance(steps[0], dict) and "action" in steps[0])


def is_mini(data: Any) -> bool:
    """Whether a parsed document is a mini-swe-agent trajectory: `{"info", "messages"}` with
    its version, or (what its first releases saved) a bare message list whose observations
    are `<returncode>` blocks."""
    if isinstance(data, list):
        return (
            bool(data)
            and all(isinstance(m, dict) and "role" in m for m in data[:2])
            and any(
                isinstance(m, dict)
                and m.get("role") == "user"
                and content_text(m.get("content")).startswith("<returncode>")
                for m in data
            )
        )
    if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
        return False
    info = data.get("info")
    form = data.get("trajectory_format")
    return (isinstance(form, str) and form.startswith("mini-swe-agent")) or (
        isinstance(info, dict) and "mini_version" in info
    )


def call_of(command: str) -> tuple[str, dict[str, str], str]:
    """A command's tool, arguments and kind."""
    text = command.strip()
    first = text.split(None, 1)[0] if text else ""
    if first in COMMANDS:
        kind = COMMANDS[first]
        if first == "str_replace_editor" and " view " in f" {text} ":
            kind = "read"
        return first, {"command": text}, kind
    if any(marker in text for marker in _SUBMIT) or first == "submit":
        return "submit", {"command": text}, "submit"
    kind = "write" if _WRITES.search(text) else "read" if _READS.match(text) else "run"
    return "bash", {"command": text}, kind


def source_write(command: str, observation: str | None, kind: str) -> bool:
    """Whether a write changed a file of the project (not a test, a reproduce script or a
    scratch file), guessed as the shared trajectories guess it: from the paths the command
    names, or the file SWE-agent's editor says it shows."""
    if kind != "write":
        return False
    shown = re.search(r"\[File: (\S+)", observation or "")
    paths = [shown.group(1)] if shown else [p for p in _PATH.findall(command.split("\n", 1)[0])]
    return any(not _NOT_SOURCE.search(path.lower()) for path in paths)


def _recorded(command: str, observation: str | None) -> Recorded:
    tool, arguments, kind = call_of(command)
    wrote = source_write(command, observation, kind)
    if observation is None:
        return Recorded(tool, arguments, None, kind=kind, source_write=wrote)
    return Recorded(
        tool,
        arguments,
        digest(observation),
        kind=kind,
        source_write=wrote,
        empty=says_nothing(observation),
        chars=len(observation),
    )


def _model(info: Any, data: dict[str, Any]) -> str:
    for holder in (info, data.get("config"), data.get("args")):
        if isinstance(holder, dict):
            for path in (("config", "model", "model_name"), ("model", "model_name")):
                found: Any = holder
                for key in path:
                    found = found.get(key) if isinstance(found, dict) else None
                if isinstance(found, str) and found:
                    return found
    return ""


def from_traj(data: dict[str, Any], run_id: str, where: str, skipped: list[Skipped]) -> Recording:
    """One recording from a SWE-agent `.traj`: a turn per step with an action."""
    turns = []
    for n, step in enumerate(data["trajectory"]):
        action = step.get("action") if isinstance(step, dict) else None
        if not isinstance(action, str):
            skipped.append(Skipped(where, f"step {n} has no `action` text"))
            continue
        if not action.strip():
            continue
        observation = step.get("observation")
        text = observation if isinstance(observation, str) else None
        turns.append((_recorded(action, text),))
    info = data.get("info")
    return Recording(
        id=run_id,
        turns=tuple(turns),
        corpus="SWE-agent",
        model=_model(info, data),
        resolved=None,
    )


def from_mini(data: Any, run_id: str, where: str, skipped: list[Skipped]) -> Recording:
    """One recording from a mini-swe-agent trajectory: a turn per assistant message with one
    bash block, its result the next user message."""
    listed = data if isinstance(data, list) else data["messages"]
    messages = [m for m in listed if isinstance(m, dict)]
    turns: list[tuple[Recorded, ...]] = []
    opening = 0
    for n, message in enumerate(messages):
        role = message.get("role")
        if not turns and role in ("system", "user"):
            opening += len(content_text(message.get("content")))
        if role != "assistant":
            continue
        blocks = _BASH_BLOCK.findall(content_text(message.get("content")))
        if len(blocks) != 1:  # mini-swe-agent refuses such a response: no command ran
            continue
        answer = messages[n + 1] if n + 1 < len(messages) else None
        result = None
        if isinstance(answer, dict) and answer.get("role") in ("user", "tool"):
            result = content_text(answer.get("content"))
        turns.append((_recorded(blocks[0], result),))
    if not turns:
        skipped.append(Skipped(where, "no bash commands in the mini-swe-agent messages"))
    info = data.get("info") if isinstance(data, dict) else None
    return Recording(
        id=run_id,
        turns=tuple(turns),
        corpus="mini-swe-agent",
        model=_model(info, data) if isinstance(data, dict) else "",
        question_chars=opening,
    )
