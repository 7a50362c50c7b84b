"""A fork's prefix from a run another runtime recorded: "what would Keel with model B have done
here?" (ADR 0051).

Two formats, read by `keel.replay.recordings` (the same reader `keel replay` uses):

    trajectories   the shared format (`shared/trajectories`): each turn's calls, arguments,
                   `kind` and a digest of each result; the result texts are not in it, so the
                   prefix shows each result as its digest (equal digests, equal texts)
    chat           an OpenAI Chat Completions message list: the calls, the assistant's text
                   beside them and each `tool` message's content, which the prefix keeps
                   as it was; the first `user` message is the question

The recorded turns up to TURN become a Keel run's events (a request, the response with its
calls under Keel's ids `k<turn>_<n>`, each call with the effect its `kind` implies as `keel
replay` decides it, each result), and `keel._run.fork.derive` counts them with the loop's own
breaker, so a recorded loop stands as near its synthesis turn as Keel would have counted it.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from keel._run import Forked, ForkPrefix, derive
from keel.errors import ConfigError
from keel.limits import Limits
from keel.messages import ToolCall, digest_text
from keel.records import (
    Event,
    JsonObject,
    JsonValue,
    ModelRequestSent,
    ModelResponseReceived,
    RecordedCall,
    RunStarted,
    ToolCallRequested,
    ToolResultRecorded,
)
from keel.replay.playback import effect_of
from keel.replay.recordings import Recorded, Recording, Skipped, read_file

if TYPE_CHECKING:
    from keel.agent import Agent
    from keel.result import RunResult

__all__ = ["fork_recording", "prefix_of_recording"]


def prefix_of_recording(
    path: Path, run_id: str | None, at: int, question: str | None, limits: Limits
) -> ForkPrefix:
    """The prefix of recording `run_id` in `path` (None: the file's only one) through its
    turn `at` (1 = its first turn that called tools), counted under `limits`."""
    skipped: list[Skipped] = []
    recordings = list(read_file(path, skipped))
    recording = _pick(recordings, run_id, path)
    if not 0 <= at <= len(recording.turns):
        raise ConfigError(
            f"recording {recording.id} has {len(recording.turns)} turns with tool calls; "
            f"there is no turn {at} to fork at (0 to {len(recording.turns)})"
        )
    chat = _chat(path, recording.id)
    asked = question or (chat.question if chat else None)
    if not asked:
        raise ConfigError(
            f"recording {recording.id} does not hold the question its agent was asked: say it "
            "with --question"
        )
    events = _events(recording, at, asked, chat)
    origin: JsonObject = {"recording": str(path), "id": recording.id, "step": at}
    return derive(asked, events, limits, at, origin)


def fork_recording(
    agent: Agent, path: Path, *, id: str | None, at: int, question: str | None = None
) -> RunResult:
    """Fork recording `id` of `path` after its turn `at` onto `agent` (its model, tools and
    limits): the recorded calls and results are the prefix, the rest runs live. Blocks, like
    `Agent.run`; `agent.launch(Forked(prefix_of_recording(...)))` in a running loop."""
    prefix = prefix_of_recording(path, id, at, question, agent.limits)

    async def go() -> RunResult:
        return await agent.launch(Forked(prefix))

    return asyncio.run(go())


def _pick(recordings: list[Recording], run_id: str | None, path: Path) -> Recording:
    if run_id is None:
        if len(recordings) == 1:
            return recordings[0]
        raise ConfigError(
            f"{path} holds {len(recordings)} recordings: name one with --id "
            f"(the first: {', '.join(r.id for r in recordings[:3])})"
        )
    for recording in recordings:
        if recording.id == run_id:
            return recording
    raise ConfigError(f"no recording {run_id} in {path} ({len(recordings)} recordings read)")


class _Chat:
    """What a chat message list holds beyond `Recording`: the texts."""

    def __init__(self, messages: list[Any]) -> None:
        self.question: str | None = None
        self.results: dict[str, str] = {}
        self.turns: list[tuple[str | None, list[str]]] = []
        """Per assistant turn with calls: its text and its calls' ids."""
        for message in messages:
            if not isinstance(message, dict):
                continue
            role = message.get("role")
            if role == "user" and self.question is None:
                self.question = _text(message.get("content")) or None
            elif role == "tool":
                self.results[str(message.get("tool_call_id"))] = _text(message.get("content"))
            elif role == "assistant" and message.get("tool_calls"):
                ids = [
                    str(c.get("id")) if isinstance(c, dict) else "" for c in message["tool_calls"]
                ]
                self.turns.append((_text(message.get("content")) or None, ids))


def _chat(path: Path, run_id: str) -> _Chat | None:
    """The message list of recording `run_id`, when `path` is a chat export (named the way
    `keel.replay.recordings.read_chat` names them); None for the trajectories format."""
    try:
        data = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, ValueError):
        return None  # JSON lines: the trajectories format
    if isinstance(data, list) and data and isinstance(data[0], dict) and "role" in data[0]:
        items: list[Any] = [data]
    elif isinstance(data, list):
        items = data
    else:
        items = [data]
    for n, item in enumerate(items, start=1):
        where = f"{path}#{n}"
        if isinstance(item, dict) and "messages" in item:
            if str(item.get("id") or where) == run_id:
                return _Chat(item["messages"]) if isinstance(item["messages"], list) else None
        elif isinstance(item, list) and where == run_id:
            return _Chat(item)
    return None


def _events(recording: Recording, at: int, question: str, chat: _Chat | None) -> list[Event]:
    now = time.time()
    model = recording.model or recording.corpus or "recorded"
    events: list[Event] = [RunStarted(question=question, model=model, at=now)]
    for step, turn in enumerate(recording.turns[:at], start=1):
        text, ids = chat.turns[step - 1] if chat and step <= len(chat.turns) else (None, [])
        events.append(
            ModelRequestSent(
                step=step,
                at=now,
                attempt=1,
                tool_choice=None,
                synthesis=None,
                items=0,
                estimated_input_tokens=0,
            )
        )
        calls = [_call(step, n, recorded, ids) for n, recorded in enumerate(turn)]
        events.append(
            ModelResponseReceived(
                step=step,
                at=now,
                text=text,
                tool_calls=tuple(
                    RecordedCall(c.id, c.name, c.raw_arguments, c.provider_id) for c in calls
                ),
            )
        )
        for call, recorded in zip(calls, turn, strict=True):
            events.append(
                ToolCallRequested(
                    step=step,
                    at=now,
                    call_id=call.id,
                    name=call.name,
                    arguments=_json(recorded.arguments),
                    call_key=call.key,
                    effect=effect_of(recorded, "kind").value,
                )
            )
        for n, (call, recorded) in enumerate(zip(calls, turn, strict=True)):
            wire = ids[n] if n < len(ids) else None
            content = chat.results.get(wire or "") if chat else None
            if content is None:
                content = _digest_text(recorded)
            events.append(
                ToolResultRecorded(
                    step=step,
                    at=now,
                    call_id=call.id,
                    call_key=call.key,
                    name=call.name,
                    content=content,
                    size=len(content),
                    digest=recorded.result or digest_text(content),
                )
            )
    return events


def _call(step: int, n: int, recorded: Recorded, ids: list[str]) -> ToolCall:
    call_id = f"k{step}_{n}"
    provider = ids[n] if n < len(ids) and ids[n] else None
    if isinstance(recorded.arguments, dict):
        call = ToolCall.from_arguments(call_id, recorded.tool, recorded.arguments)
    else:
        call = ToolCall.from_raw(call_id, recorded.tool, str(recorded.arguments))
    return ToolCall.from_raw(call.id, call.name, call.raw_arguments, provider_id=provider)


def _digest_text(recorded: Recorded) -> str:
    if recorded.result is None:
        return "(recorded: the recording holds no result for this call)"
    return (
        f"(recorded result {recorded.result}: the recording keeps a digest of the result, "
        "not its text)"
    )


def _json(value: Any) -> JsonValue:
    return value if isinstance(value, dict | list | str | int | float | bool) else str(value)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)
