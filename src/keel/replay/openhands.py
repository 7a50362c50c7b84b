"""Recordings from OpenHands event logs: the `history` of its evaluation output (one
`{"instance_id", "history": [...]}` per line of `output.jsonl`), a trajectory saved as a JSON
list of events, or one event per line.

    action        `{"id", "source": "agent", "action": "run", "args": {...},
                  "tool_call_metadata": {"function_name", "tool_call_id", "model_response"}}`
    observation   `{"observation": "run", "cause": ACTION_ID, "content": "...",
                  "tool_call_metadata": {...}}`; `observation` "error" marks a failed call

A call is an agent action with `tool_call_metadata` (function calling), or one of the actions
that act (run, read, edit, browse, ...) without it (older, text-command agents). Its tool is the
metadata's `function_name` (else the action), its arguments the model's own, read from the
`model_response` by `tool_call_id` (else the action's `args` without OpenHands' bookkeeping:
the thought, the security risk, ...). The actions of one model response (`model_response.id`)
are one turn; an action without one is a turn of its own. The result is the observation whose
`cause` is the action's id (else the one with its `tool_call_id`). Older logs pair each action
with its observation (`[[action, observation], ...]`); those are read too.

The OpenHands SDK's events (a conversation's events as a JSON list, or one per line) carry a
`kind`: an `ActionEvent` (`tool_name`, `tool_call` with the model's `arguments`,
`llm_response_id`: one response, one turn) is answered by the `ObservationEvent` with its
`tool_call_id` (`observation.content` as text parts, `observation.is_error`), an
`AgentErrorEvent` (an error) or a `UserRejectObservation`. Its file editor's `view` reads.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from keel.errors import ConfigError
from keel.informative import says_nothing
from keel.replay.lines import Bounds, Overlong, TooBig, loads, text
from keel.replay.recorded import (
    WRONG,
    Recorded,
    Recording,
    Skipped,
    content_text,
    digest,
    parse_arguments,
)

__all__ = [
    "from_events",
    "is_event",
    "is_events_file",
    "is_log",
    "read_events",
    "read_folder",
]

ACTING = frozenset(
    {"run", "run_ipython", "read", "write", "edit", "browse", "browse_interactive", "delegate"}
)
"""Actions that are tool calls even without `tool_call_metadata`."""
KINDS = {
    "run": "run",
    "run_ipython": "run",
    "read": "read",
    "browse": "read",
    "browse_interactive": "read",
    "write": "write",
    "edit": "write",
    "finish": "submit",
}
SDK_KINDS = {
    "execute_bash": "run",
    "terminal": "run",
    "str_replace_editor": "edit",
    "file_editor": "edit",
    "finish": "submit",
}
"""The OpenHands SDK's tools by name, for their kind (`edit`: by the command)."""
SDK_ANSWERS = ("ObservationEvent", "AgentErrorEvent", "UserRejectObservation")
SDK_EVENTS = ("ActionEvent", "MessageEvent", "SystemPromptEvent", *SDK_ANSWERS)
"""The SDK's event kinds (`kind`) that say a value is one of its events (tuples: a value
read from a file may be a list, which no set can be asked about)."""
BOOKKEEPING = frozenset(
    {"thought", "security_risk", "confirmation_state", "blocking", "hidden", "impl_source"}
)
"""An action's `args` that OpenHands adds, not the model."""


def is_event(data: Any) -> bool:
    """Whether a parsed value is one OpenHands event."""
    if not isinstance(data, dict):
        return False
    if data.get("kind") in SDK_EVENTS:
        return True
    return (isinstance(data.get("action"), str) or isinstance(data.get("observation"), str)) and (
        "source" in data or "tool_call_metadata" in data or "cause" in data
    )


def is_log(data: Any) -> bool:
    """Whether a parsed value is a whole log: a list of events (or of pairs), or an object
    with a `history` list."""
    if isinstance(data, dict):
        return isinstance(data.get("history"), list) and "turns" not in data
    if isinstance(data, list) and data:
        first = data[0]
        if isinstance(first, list) and first:
            first = first[0]
        return is_event(first)
    return False


def from_events(
    events: Iterable[Any],
    run_id: str,
    where: str,
    skipped: list[Skipped],
    bounds: Bounds,
    model: str = "",
) -> Recording:
    """One recording from a log's events, in order."""
    flat = _flatten(events)
    answers: dict[str, tuple[str, bool]] = {}
    for event in flat:
        found = _answer(event)
        if found is not None:
            keys, answer = found
            for key in keys:
                answers.setdefault(key, answer)
    turns: list[list[Recorded]] = []
    previous: str | None = None
    for n, event in enumerate(flat):
        call = _call(event, n, where, skipped, bounds)
        if call is None:
            continue
        response, tool, arguments, kind, ids = call
        model = model or _model(event)
        text, error = answers.get(ids[0]) or answers.get(ids[1]) or (None, False)
        result = None if text is None else digest(text)
        empty = text is not None and says_nothing(text)
        chars = None if text is None else len(text)
        recorded = Recorded(
            tool, arguments, result, kind=kind, empty=empty, error=error, chars=chars
        )
        if response is not None and response == previous and turns:
            turns[-1].append(recorded)
        else:
            turns.append([recorded])
        previous = response
    return Recording(
        id=run_id, turns=tuple(tuple(t) for t in turns), corpus="openhands", model=model
    )


def _answer(event: dict[str, Any]) -> tuple[list[str], tuple[str, bool]] | None:
    """An observation's keys (its action's id, its call id) and its text and error flag."""
    if isinstance(event.get("observation"), str):  # the event stream's own
        keys = [] if event.get("cause") is None else [f"id {event['cause']}"]
        metadata = event.get("tool_call_metadata")
        if isinstance(metadata, dict) and metadata.get("tool_call_id") is not None:
            keys.append(f"call {metadata['tool_call_id']}")
        text = content_text(event.get("content"))
        return keys, (text, event["observation"] == "error")
    kind = event.get("kind")
    if kind not in SDK_ANSWERS:  # the SDK's: ObservationEvent, AgentErrorEvent, a rejection
        return None
    keys = [f"call {event['tool_call_id']}"] if event.get("tool_call_id") is not None else []
    if event.get("action_id") is not None:
        keys.append(f"id {event['action_id']}")
    observation = event.get("observation")
    if kind == "ObservationEvent" and isinstance(observation, dict):
        return keys, (content_text(observation.get("content")), observation.get("is_error") is True)
    if kind == "AgentErrorEvent":
        return keys, (str(event.get("error") or ""), True)
    return keys, (str(event.get("rejection_reason") or ""), False)


def _sdk_call(
    event: dict[str, Any], n: int, where: str, skipped: list[Skipped], bounds: Bounds
) -> tuple[str | None, str, Any, str | None, tuple[str, str]] | None:
    """An SDK `ActionEvent`'s call: its `tool_call` as the model sent it."""
    call = event.get("tool_call")
    call = call if isinstance(call, dict) else {}
    tool = event.get("tool_name") or call.get("name")
    if not isinstance(tool, str) or not tool:
        skipped.append(Skipped(where, f"event {event.get('id', n)}: an action without a tool name"))
        return None
    arguments = parse_arguments(call.get("arguments"), bounds)
    if arguments is WRONG:
        skipped.append(
            Skipped(
                where, f"event {event.get('id', n)}: the arguments of {tool!r} are not an object"
            )
        )
        return None
    kind = SDK_KINDS.get(tool)
    if kind == "edit":  # the file editor: a view reads, anything else writes
        view = isinstance(arguments, dict) and arguments.get("command") == "view"
        kind = "read" if view else "write"
    response = event.get("llm_response_id")
    call_id = event.get("tool_call_id") or call.get("id")
    ids = (f"call {call_id}", f"id {event.get('id')}")
    return None if response is None else str(response), tool, arguments, kind, ids


def _flatten(events: Iterable[Any]) -> list[dict[str, Any]]:
    flat = []
    for event in events:
        for item in event if isinstance(event, list) else [event]:
            if isinstance(item, dict):
                flat.append(item)
    return flat


def _call(
    event: dict[str, Any], n: int, where: str, skipped: list[Skipped], bounds: Bounds
) -> tuple[str | None, str, Any, str | None, tuple[str, str]] | None:
    """An action's (response id, tool, arguments, kind, its answer's keys), or None."""
    if event.get("kind") == "ActionEvent":
        return _sdk_call(event, n, where, skipped, bounds)
    action = event.get("action")
    if not isinstance(action, str) or event.get("source", "agent") != "agent":
        return None
    metadata = event.get("tool_call_metadata")
    if not isinstance(metadata, dict):
        if action not in ACTING:
            return None
        metadata = {}
    tool = metadata.get("function_name")
    tool = tool if isinstance(tool, str) and tool else action
    call_id = metadata.get("tool_call_id")
    response = metadata.get("model_response")
    response = response if isinstance(response, dict) else {}
    arguments = _model_arguments(response, call_id, bounds)
    if arguments is WRONG:
        skipped.append(
            Skipped(
                where, f"event {event.get('id', n)}: the arguments of {tool!r} are not an object"
            )
        )
        return None
    if arguments is None:
        args = event.get("args")
        args = args if isinstance(args, dict) else {}
        arguments = {k: v for k, v in args.items() if k not in BOOKKEEPING}
    response_id = response.get("id")
    return (
        None if response_id is None else str(response_id),
        tool,
        arguments,
        KINDS.get(action),
        (f"id {event.get('id')}", f"call {call_id}"),
    )


def _model_arguments(response: dict[str, Any], call_id: Any, bounds: Bounds) -> Any:
    """The arguments the model sent for this call, from its response; None if not there."""
    choices = response.get("choices")
    if call_id is None or not isinstance(choices, list) or not choices:
        return None
    message = choices[0].get("message") if isinstance(choices[0], dict) else None
    calls = message.get("tool_calls") if isinstance(message, dict) else None
    for call in calls if isinstance(calls, list) else ():
        if isinstance(call, dict) and call.get("id") == call_id:
            function = call.get("function")
            if isinstance(function, dict):
                return parse_arguments(function.get("arguments"), bounds)
    return None


def _model(event: dict[str, Any]) -> str:
    metadata = event.get("tool_call_metadata")
    response = metadata.get("model_response") if isinstance(metadata, dict) else None
    return str(response.get("model") or "") if isinstance(response, dict) else ""


MAX_EVENT_FILES = 100_000
"""Event files read from one OpenHands `events/` folder; the rest are counted, not read."""


_EVENT_FILE = re.compile(r"(?:event-)?(\d+)(?:-[^/]*)?\.json")
"""An event file's name: `N.json` (OpenHands' file store) or `event-NNNNN-ID.json` (the
OpenHands SDK's persistence folder)."""


def _event_number(path: Path) -> int | None:
    found = _EVENT_FILE.fullmatch(path.name)
    return int(found.group(1)) if found else None


def is_events_file(path: Path) -> bool:
    """One file of an OpenHands `events/` folder: a numbered event file in a folder named
    `events`."""
    return path.parent.name == "events" and _event_number(path) is not None


def read_folder(
    path: Path, skipped: list[Skipped], bounds: Bounds | None = None
) -> Iterator[Recording]:
    """An OpenHands `events/` folder (a session's events, one per numbered file) as one
    run, in the files' numeric order."""
    try:
        files = [p for p in path.iterdir() if _event_number(p) is not None]
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not files:
        skipped.append(
            Skipped(str(path), "no numbered event files in it: not an OpenHands events/ folder")
        )
        return
    yield from read_events(files, skipped, bounds)


def read_events(
    files: list[Path], skipped: list[Skipped], bounds: Bounds | None = None
) -> Iterator[Recording]:
    """The files of one OpenHands `events/` folder (each one event) as one run."""
    bounds = bounds or Bounds()
    ordered = sorted(files, key=lambda p: (_event_number(p) or 0, p.name))
    if len(ordered) > MAX_EVENT_FILES:
        more = len(ordered) - MAX_EVENT_FILES
        skipped.append(Skipped(str(ordered[0].parent), f"{more} more event files not read"))
        ordered = ordered[:MAX_EVENT_FILES]
    events = []
    for file in ordered:
        try:
            whole = text(file, bounds)
        except (OSError, EOFError) as exc:
            raise ConfigError(
                f"cannot read {file}: {getattr(exc, 'strerror', None) or exc}"
            ) from None
        if isinstance(whole, Overlong):
            skipped.append(Skipped(str(file), whole.reason))
            continue
        try:
            event = loads(whole, bounds)
        except TooBig as exc:
            skipped.append(Skipped(str(file), str(exc)))
            continue
        except json.JSONDecodeError as exc:
            skipped.append(Skipped(f"{file}:{exc.lineno}", f"not JSON ({exc.msg})"))
            continue
        if not isinstance(event, dict):  # other kinds of event (state updates) pass by
            skipped.append(Skipped(str(file), "not an OpenHands event (not an object)"))
            continue
        events.append(event)
    folder = ordered[0].parent if ordered else Path(".")
    run_id = folder.parent.name if folder.name == "events" and folder.parent.name else str(folder)
    yield from_events(events, run_id, str(folder), skipped, bounds)
