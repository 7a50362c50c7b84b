"""Recordings from NeMo Gym's rollouts: one JSON line per run, the run as OpenAI Responses items
with the environment's verdict (ADR 0064's second held-out set).

    {"responses_create_params": {"input": ..., "tools": ...},
     "response": {"model": ..., "output": [
         {"type": "function_call", "name", "arguments", "call_id"},
         {"type": "function_call_output", "call_id", "output"},
         {"type": "message" | "reasoning", ...}, ...]},
     "reward": 1.0, "resolved": true, ...}

The calls the model asked for together (before any of their outputs) are one turn; a call
after an output starts the next. Each call's result is the `function_call_output` with its
`call_id`. The verdict is `resolved` where the line has it, else the reward: at least 1 is
resolved, at most 0 is not, partial credit is not judged. A tool's kind comes from its name
(Claude Code's and the usual lower-case file tools), and a shell tool's from its command, as
SWE-agent's are read (`keel.replay.swe_agent.call_of`).
"""

from __future__ import annotations

from typing import Any

from keel.informative import says_nothing
from keel.replay.claude_code import KINDS
from keel.replay.lines import Bounds
from keel.replay.recorded import (
    WRONG,
    Recorded,
    Recording,
    Skipped,
    content_text,
    digest,
    parse_arguments,
    unreadable_arguments,
)
from keel.replay.swe_agent import call_of

__all__ = ["from_rollout", "is_rollout"]

_NAMED_KINDS = {
    **{name.lower(): kind for name, kind in KINDS.items()},
    "read_file": "read",
    "view": "read",
    "list_files": "read",
    "write_file": "write",
    "create": "write",
    "str_replace": "write",
    "apply_patch": "write",
}
_SHELLS = {"bash", "terminal", "shell", "execute_bash", "run_command", "run_shell_command"}


def is_rollout(data: Any) -> bool:
    """Whether a parsed line is a NeMo Gym rollout: a `response` with an `output` list, beside
    the request it answered or the reward it earned."""
    if not isinstance(data, dict) or not isinstance(data.get("response"), dict):
        return False
    return "output" in data["response"] and ("responses_create_params" in data or "reward" in data)


def verdict(data: dict[str, Any]) -> bool | None:
    """Resolved where the rollout says so, else from its reward (partial credit: not judged)."""
    given = data.get("resolved")
    if isinstance(given, bool):
        return given
    reward = data.get("reward")
    if isinstance(reward, bool) or not isinstance(reward, int | float):
        return None
    return True if reward >= 1 else False if reward <= 0 else None


def _kind(tool: str, arguments: Any) -> str | None:
    if tool.lower() in _SHELLS and isinstance(arguments, dict):
        command = arguments.get("command")
        if isinstance(command, str):
            return call_of(command)[2]
    return _NAMED_KINDS.get(tool.lower())


def _question(data: dict[str, Any]) -> int:
    request = data.get("responses_create_params")
    if not isinstance(request, dict):
        return 0
    given = request.get("input")
    items = given if isinstance(given, list) else [{"content": given}]
    told = sum(len(content_text(i.get("content"))) for i in items if isinstance(i, dict))
    return told + len(content_text(request.get("instructions")))


def from_rollout(
    data: dict[str, Any], where: str, skipped: list[Skipped], bounds: Bounds
) -> Recording | None:
    """One recording from a rollout; one whose items cannot be read is reported and skipped."""
    response = data["response"]
    output = response.get("output")
    if not isinstance(output, list):
        skipped.append(Skipped(where, "the response's `output` is not a list of items"))
        return None
    items = [item for item in output if isinstance(item, dict)]
    results: dict[str, str] = {}
    for item in items:
        if item.get("type") == "function_call_output":
            results[str(item.get("call_id"))] = content_text(item.get("output"))
    turns: list[tuple[Recorded, ...]] = []
    texts: list[int] = []
    current: list[Recorded] = []
    said = 0
    for n, item in enumerate(items):
        kind = item.get("type")
        if kind == "function_call_output" and current:
            turns.append(tuple(current))
            texts.append(said)
            current, said = [], 0
        elif kind == "message":
            said += len(content_text(item.get("content")))
        elif kind == "function_call":
            call = _call(item, n, results, where, skipped, bounds)
            if call is None:
                return None
            current.append(call)
    if current:
        turns.append(tuple(current))
        texts.append(said)
    given = data.get("instance_id") or response.get("id")
    return Recording(
        id=str(given or where),
        turns=tuple(turns),
        corpus="nemo-gym",
        model=str(response.get("model") or ""),
        resolved=verdict(data),
        question_chars=_question(data),
        texts=tuple(texts),
    )


def _call(
    item: dict[str, Any],
    n: int,
    results: dict[str, str],
    where: str,
    skipped: list[Skipped],
    bounds: Bounds,
) -> Recorded | None:
    tool = item.get("name")
    if not isinstance(tool, str):
        skipped.append(Skipped(where, f"output item {n}: a function call without a `name`"))
        return None
    arguments = parse_arguments(item.get("arguments"), bounds)
    if arguments is WRONG:
        skipped.append(unreadable_arguments(where, f"output item {n}", tool, bounds))
        return None
    result = results.get(str(item.get("call_id")))
    if result is None:
        return Recorded(tool, arguments, None, kind=_kind(tool, arguments))
    return Recorded(
        tool,
        arguments,
        digest(result),
        kind=_kind(tool, arguments),
        empty=says_nothing(result),
        chars=len(result),
    )
