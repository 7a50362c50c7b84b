"""Recorded runs to replay, from many sources, as one shape: `Recording`.

    trajectories   JSON lines (optionally gzipped) in the `shared/trajectories` format: one
                   run per line, `turns` a list of turns, each a list of calls with `tool`,
                   `arguments`, `result_digest`, `kind` and `source_write`
    chat           OpenAI Chat Completions message lists: a JSON file or JSON lines of
                   `{"messages": [...]}` (or a bare list of messages), what logging tools export
    otel           OpenTelemetry GenAI spans and OpenAI Agents SDK traces (`keel.replay.otel`)
    claude-code    Claude Code session JSON lines (`keel.replay.claude_code`)
    openhands      OpenHands event logs and SDK events (`keel.replay.openhands`), and an
                   OpenHands `events/` folder (one event per numbered file) as one run
    swe-agent      SWE-agent `.traj` files and mini-swe-agent `.traj.json` files
                   (`keel.replay.swe_agent`)
    nemo-gym       NeMo Gym rollouts: JSON lines of OpenAI Responses items with the
                   environment's verdict (`keel.replay.nemo_gym`)
    store          Keel's own stored runs (`--store`): the calls each turn asked for, with the
                   digests of the results they got

A file's format is told by its first value (`read_file` with `format` auto): a line with
`turns` or `messages` is read line by line as before (each line's keys decide); OpenHands
events, spans and Claude Code lines pick their reader for the whole file.

A line that cannot be read (not JSON, wrong types, nested too deep, longer than its cap: see
`keel.replay.lines`) is reported with its file and line number and skipped; nothing here raises
on bad input except `ConfigError` for a file that cannot be opened at all.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from keel.errors import ConfigError
from keel.informative import says_nothing
from keel.replay import nemo_gym, openhands, swe_agent
from keel.replay.claude_code import is_entry, read_entries
from keel.replay.lines import Bounds, Overlong, TooBig, documents, lines, loads, text
from keel.replay.otel import is_spans, read_spans
from keel.replay.recorded import (
    WRONG,
    Recorded,
    Recording,
    Skipped,
    content_text,
    digest,
    parse_arguments,
    size,
    unreadable_arguments,
)
from keel.replay.stored import read_store

__all__ = [
    "FORMATS",
    "Format",
    "Recorded",
    "Recording",
    "Skipped",
    "read_chat",
    "read_file",
    "read_store",
]

Format = Literal[
    "auto", "trajectories", "chat", "otel", "claude-code", "openhands", "swe-agent", "nemo-gym"
]


FORMATS: tuple[Format, ...] = (
    "auto",
    "trajectories",
    "chat",
    "otel",
    "claude-code",
    "openhands",
    "swe-agent",
    "nemo-gym",
)
"""`keel replay --format`: auto tells them apart by the first value of the file."""


def read_file(
    path: Path, skipped: list[Skipped], bounds: Bounds | None = None, format: Format = "auto"
) -> Iterator[Recording]:
    """Recordings from a file in any of the formats, told apart by the file's first value
    (`format` auto) or as `format` says. At most MAX_REPORTED lines of one file are reported;
    the rest are counted in one more report."""
    reports = _Capped()
    try:
        yield from _read_file(path, reports, bounds or Bounds(), format)
    finally:
        skipped.extend(reports)
        if reports.dropped:
            more = f"{reports.dropped} more lines could not be read (not listed)"
            skipped.append(Skipped(str(path), more))


MAX_REPORTED = 1000


class _Capped(list[Skipped]):
    """Reports of one file, up to MAX_REPORTED; past it only counted (a file of a billion
    bad lines must not hold a billion reports)."""

    dropped = 0

    def append(self, item: Skipped) -> None:
        if len(self) < MAX_REPORTED:
            super().append(item)
        else:
            self.dropped += 1


def _read_file(
    path: Path, skipped: list[Skipped], bounds: Bounds, fmt: Format
) -> Iterator[Recording]:
    try:
        read = lines(path, bounds)
        first = next(read, None)
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    if first is None:
        return
    _, line = first
    rest: Iterator[tuple[int, str | Overlong]] = read
    if isinstance(line, str):
        stripped = line.lstrip()
        whole = not _is_one_line(line)
        if stripped.startswith("[") and not whole:  # a value of its own: lines, if more follow
            second = _next(read, path, skipped)
            rest = itertools.chain([] if second is None else [second], read)
            whole = second is None
        if whole and (stripped.startswith(("[", "{")) or fmt == "otel"):
            read.close()
            yield from _read_document(path, skipped, bounds, fmt)
            return
    values = _values(_chain(first, rest, path, skipped), path, skipped, bounds)
    head = next(values, None)
    if head is None:
        return
    chosen = _sniff(head[1]) if fmt == "auto" else fmt
    values = itertools.chain([head], values)
    if chosen == "otel":
        yield from read_spans(values, skipped, bounds)
    elif chosen == "claude-code":
        yield from read_entries(values, skipped, bounds)
    elif chosen == "openhands" and not openhands.is_log(head[1]):  # one event per line
        events = (event for _, event in values)
        yield openhands.from_events(events, str(path), str(path), skipped, bounds)
    else:  # one run per line; unless named, each line's keys tell its format
        for where, data in values:
            recording = _from_object(data, where, skipped, bounds, fmt)
            if recording is not None:
                yield recording


def _values(
    numbered: Iterator[tuple[int, str | Overlong]],
    path: Path,
    skipped: list[Skipped],
    bounds: Bounds,
) -> Iterator[tuple[str, Any]]:
    """Each line's JSON value with where it is; a line that cannot be read is reported."""
    for number, line in numbered:
        where = f"{path}:{number}"
        if isinstance(line, Overlong):
            skipped.append(Skipped(where, line.reason))
            continue
        try:
            yield where, loads(line, bounds)
        except TooBig as exc:
            skipped.append(Skipped(where, str(exc)))
        except json.JSONDecodeError as exc:
            skipped.append(Skipped(where, f"not JSON ({exc.msg})"))


def _sniff(data: Any) -> Format:
    """The format a file's first value is in; auto for none of them."""
    if nemo_gym.is_rollout(data):
        return "nemo-gym"
    if swe_agent.is_traj(data) or swe_agent.is_mini(data):
        return "swe-agent"
    if isinstance(data, dict) and ("turns" in data or "messages" in data):
        return "trajectories" if "turns" in data else "chat"
    if openhands.is_log(data) or openhands.is_event(data):
        return "openhands"
    if is_spans(data):
        return "otel"
    if is_entry(data):
        return "claude-code"
    return "auto"  # neither: the line readers say what it lacks


def _chain(
    first: tuple[int, str | Overlong],
    rest: Iterator[tuple[int, str | Overlong]],
    path: Path,
    skipped: list[Skipped],
) -> Iterator[tuple[int, str | Overlong]]:
    yield first
    try:
        yield from rest
    except (OSError, EOFError) as exc:  # a truncated gzip stream: keep what was read
        skipped.append(Skipped(str(path), f"the file ends early ({exc})"))


def _from_object(
    data: Any, where: str, skipped: list[Skipped], bounds: Bounds, fmt: Format = "auto"
) -> Recording | None:
    if fmt in ("auto", "nemo-gym") and nemo_gym.is_rollout(data):
        return nemo_gym.from_rollout(data, where, skipped, bounds)
    if fmt == "nemo-gym":
        skipped.append(Skipped(where, "not a NeMo Gym rollout (no `response` with an `output`)"))
        return None
    handled, swe = _from_swe_agent(data, where, skipped, fmt)
    if handled:
        return swe
    if fmt in ("auto", "openhands") and openhands.is_log(data):
        return _from_openhands(data, where, skipped, bounds)
    if fmt == "openhands":
        skipped.append(Skipped(where, "not an OpenHands log (no `history` list of events)"))
        return None
    if fmt == "chat" and not isinstance(data, list) and not isinstance(data, dict):
        skipped.append(Skipped(where, "no `messages` list"))
        return None
    if (
        fmt != "trajectories"
        and isinstance(data, dict)
        and "messages" in data
        and "turns" not in data
    ):
        run_id = str(data.get("id") or where)
        return _from_messages(data["messages"], run_id, where, skipped, bounds)
    if isinstance(data, list) and fmt != "trajectories":
        return _from_messages(data, where, where, skipped, bounds)
    if fmt == "chat":
        skipped.append(Skipped(where, "no `messages` list"))
        return None
    if not isinstance(data, dict) or not isinstance(data.get("turns"), list):
        missing = (
            "no `turns` list" if fmt == "trajectories" else "no `turns` list (and no `messages`)"
        )
        skipped.append(Skipped(where, missing))
        return None
    turns = []
    for t, turn in enumerate(data["turns"]):
        if not isinstance(turn, list):
            skipped.append(Skipped(where, f"turn {t} is not a list of calls"))
            return None
        calls = []
        for call in turn:
            if not isinstance(call, dict) or not isinstance(call.get("tool"), str):
                skipped.append(Skipped(where, f"turn {t} has a call without a `tool` name"))
                return None
            digest = call.get("result_digest")
            calls.append(
                Recorded(
                    tool=call["tool"],
                    arguments=call.get("arguments", {}),
                    result=digest if isinstance(digest, str) else None,
                    kind=call["kind"] if isinstance(call.get("kind"), str) else None,
                    source_write=call.get("source_write") is True,
                    empty=call.get("result_chars") == 0,
                    error=call.get("error") is True,
                    chars=size(call.get("result_chars")),
                )
            )
        turns.append(tuple(calls))
    resolved = data.get("resolved")
    return Recording(
        id=str(data.get("id") or where),
        turns=tuple(turns),
        corpus=str(data.get("corpus") or ""),
        model=str(data.get("model") or ""),
        resolved=resolved if isinstance(resolved, bool) else None,
    )


def read_chat(
    path: Path, skipped: list[Skipped], bounds: Bounds | None = None
) -> Iterator[Recording]:
    """A JSON file holding one message list, `{"messages": [...]}`, or a list of those."""
    yield from _read_document(path, skipped, bounds or Bounds(), "chat")


def _read_document(
    path: Path, skipped: list[Skipped], bounds: Bounds, fmt: Format
) -> Iterator[Recording]:
    """A file that is one JSON document: a chat message list (or a list of them), a trace
    export, an OpenHands log, or a list of any of the line formats' values."""
    try:
        whole = text(path, bounds)
    except (OSError, EOFError) as exc:
        raise ConfigError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    if isinstance(whole, Overlong):
        skipped.append(Skipped(str(path), whole.reason))
        return
    try:
        data = loads(whole, bounds)
    except TooBig as exc:
        skipped.append(Skipped(str(path), str(exc)))
        return
    except json.JSONDecodeError as exc:
        if exc.msg != "Extra data":
            skipped.append(Skipped(f"{path}:{exc.lineno}", f"not JSON ({exc.msg})"))
            return
        yield from _read_documents(path, whole, skipped, bounds, fmt)
        return
    if fmt == "otel" or (fmt == "auto" and is_spans(data)):
        yield from read_spans([(str(path), data)], skipped, bounds)
        return
    if fmt == "claude-code" or (
        fmt == "auto" and isinstance(data, list) and data and is_entry(data[0])
    ):
        entries = data if isinstance(data, list) else [data]
        yield from read_entries(
            ((f"{path}#{n}", e) for n, e in enumerate(entries, 1)), skipped, bounds
        )
        return
    if swe_agent.is_traj(data) or swe_agent.is_mini(data) or fmt == "swe-agent":
        recording = _from_object(data, str(path), skipped, bounds, fmt)
        if recording is not None:
            yield recording
        return
    if fmt in ("auto", "openhands") and openhands.is_log(data):
        yield _from_openhands(data, str(path), skipped, bounds)
        return
    items = data if isinstance(data, list) and data and isinstance(data[0], dict | list) else [data]
    if isinstance(data, list) and data and isinstance(data[0], dict) and "role" in data[0]:
        items = [data]  # one bare message list
    for n, item in enumerate(items, start=1):
        recording = _from_object(item, f"{path}#{n}", skipped, bounds, fmt)
        if recording is not None:
            yield recording


def _read_documents(
    path: Path, whole: str, skipped: list[Skipped], bounds: Bounds, fmt: Format
) -> Iterator[Recording]:
    """A file of many JSON documents one after another (the console exporter's spans, each
    printed over many lines), with whatever else was printed between them passed over."""
    try:
        found, passed = documents(whole, bounds)
    except TooBig as exc:
        skipped.append(Skipped(str(path), str(exc)))
        return
    if passed:
        first = passed[0]
        lines_passed = f"{len(passed)} lines that start no JSON value (from line {first})"
        skipped.append(Skipped(str(path), f"{lines_passed} passed over"))
    values = [(f"{path}:{line}", value) for line, value in found]
    if not values:
        return
    chosen = _sniff(values[0][1]) if fmt == "auto" else fmt
    if chosen == "otel":
        yield from read_spans(values, skipped, bounds)
        return
    for where, value in values:
        recording = _from_object(value, where, skipped, bounds, fmt)
        if recording is not None:
            yield recording


def _from_swe_agent(
    data: Any, where: str, skipped: list[Skipped], fmt: Format
) -> tuple[bool, Recording | None]:
    """A SWE-agent or mini-swe-agent trajectory read as one (auto, swe-agent), or refused by
    name under another format: never read as a run of another kind. (False, None): neither."""
    traj, mini = swe_agent.is_traj(data), swe_agent.is_mini(data)
    if fmt == "swe-agent" and not (traj or mini):
        skipped.append(Skipped(where, "not a SWE-agent or mini-swe-agent trajectory"))
        return True, None
    if not (traj or mini):
        return False, None
    if fmt not in ("auto", "swe-agent"):
        name = "a SWE-agent .traj" if traj else "a mini-swe-agent trajectory"
        skipped.append(Skipped(where, f"{name}, not {fmt}: give --format swe-agent (or auto)"))
        return True, None
    name = where.rsplit("/", 1)[-1]
    stem = name.removesuffix(".json").removesuffix(".traj")
    given = data.get("instance_id") if isinstance(data, dict) else None
    run_id = str(given or (where if ":" in name or "#" in name else stem))
    if traj:
        return True, swe_agent.from_traj(data, run_id, where, skipped)
    return True, swe_agent.from_mini(data, run_id, where, skipped)


def _from_openhands(data: Any, where: str, skipped: list[Skipped], bounds: Bounds) -> Recording:
    """An OpenHands log: a list of events, or `{"instance_id", "history", "metadata"}`."""
    if isinstance(data, list):
        return openhands.from_events(data, where, where, skipped, bounds)
    metadata = data.get("metadata")
    config = metadata.get("llm_config") if isinstance(metadata, dict) else None
    model = config.get("model") if isinstance(config, dict) else None
    run_id = str(data.get("instance_id") or data.get("id") or where)
    recording = openhands.from_events(
        data["history"], run_id, where, skipped, bounds, str(model or "")
    )
    resolved = data.get("resolved")
    return replace(recording, resolved=resolved) if isinstance(resolved, bool) else recording


def _from_messages(
    messages: Any, run_id: str, where: str, skipped: list[Skipped], bounds: Bounds
) -> Recording | None:
    """Assistant `tool_calls` in order, each answered by the `tool` message with its id. A
    field of the wrong type skips the recording, saying which."""
    if not isinstance(messages, list):
        skipped.append(Skipped(where, "`messages` is not a list"))
        return None
    results: dict[str, str] = {}
    sizes: dict[str, int] = {}
    empty: set[str] = set()
    for message in messages:
        if isinstance(message, dict) and message.get("role") == "tool":
            content = content_text(message.get("content"))
            results[str(message.get("tool_call_id"))] = digest(content)
            sizes[str(message.get("tool_call_id"))] = len(content)
            if says_nothing(content):
                empty.add(str(message.get("tool_call_id")))
    turns: list[tuple[Recorded, ...]] = []
    texts: list[int] = []
    opening = 0
    for m, message in enumerate(messages):
        if not isinstance(message, dict):
            continue
        if not turns and message.get("role") in ("system", "developer", "user"):
            opening += len(content_text(message.get("content")))
        if message.get("role") != "assistant":
            continue
        asked = message.get("tool_calls") or []
        if not isinstance(asked, list):
            skipped.append(Skipped(where, f"message {m}: `tool_calls` is not a list"))
            return None
        calls = []
        for call in asked:
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                skipped.append(Skipped(where, f"message {m}: a tool call without a function name"))
                return None
            arguments = parse_arguments(function.get("arguments"), bounds)
            if arguments is WRONG:
                skipped.append(
                    unreadable_arguments(where, f"message {m}", function["name"], bounds)
                )
                return None
            call_id = str(call.get("id"))
            calls.append(
                Recorded(
                    function["name"],
                    arguments,
                    results.get(call_id),
                    empty=call_id in empty,
                    chars=sizes.get(call_id),
                )
            )
        if calls:
            turns.append(tuple(calls))
            texts.append(len(content_text(message.get("content"))))
    return Recording(id=run_id, turns=tuple(turns), question_chars=opening, texts=tuple(texts))


def _next(
    read: Iterator[tuple[int, str | Overlong]], path: Path, skipped: list[Skipped]
) -> tuple[int, str | Overlong] | None:
    """The next line, or None at the end (or where a truncated gzip stream ends)."""
    try:
        return next(read, None)
    except (OSError, EOFError) as exc:
        skipped.append(Skipped(str(path), f"the file ends early ({exc})"))
        return None


def _is_one_line(line: str) -> bool:
    """Whether a first line is a JSON value of its own (a JSON lines file), not the start of
    a document over many lines; one too deep to parse is judged a line of its own."""
    try:
        json.loads(line)
    except RecursionError:
        return True
    except ValueError:
        return False
    return True
