"""A run's typed events, streamed to the caller as they happen: `agent.stream(question)`.

    stream = agent.stream("Which modules does the loop use?")
    async for event in stream:          # RunStarted, ModelRequestSent, ToolCallRequested, ...
        print(event.seq, event.type)
    result = await stream               # the RunResult

The events are the run's record itself: the same objects, in the same order, with the same
`seq`, that the store saves and `keel show --json` prints. The stream subscribes as a listener
and never makes the run wait: each event is put on an unbounded queue, so a consumer that
lags only falls behind; the loop and its checkpoints go on at their own pace. What a lagging
consumer holds in memory is the run's own event log (bounded by the run's budgets and the
result size cap), and it is released as the consumer catches up (ADR 0024). Leaving the loop
early does not stop the run: `cancel()` does.

Beside the record, the stream carries the model's text as it is written (ADR 0039):
`TextDelta` pieces and `TextDiscarded` markers (drop what a failed attempt streamed). They are
not events of the record: no `seq`, never stored, never counted; the `ModelResponseReceived`
that follows is the record of the answer. Only a stream asks the model to stream, and only
when its transport can (`stream(q, text=False)` does not ask).

`stream_lines` is the command line's `--events`: one JSON object per line, the final line
the result, written from a thread so a slow reader of stdout never blocks the run either. A
reader that goes away (`| head -1`) or a disk that fills only ends the lines: the thread keeps
taking them and drops them, and the run goes on.
"""

from __future__ import annotations

import asyncio
import json
import queue
import threading
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Protocol

from keel.records import Event, ToolResultRecorded, encode_event
from keel.result import RunResult
from keel.transports.streaming import TextDelta, TextDiscarded, TextEvent

__all__ = [
    "ChildEvent",
    "LineSink",
    "RunStream",
    "TreeListener",
    "event_json",
    "result_line",
    "stream_lines",
]

_END = None


def event_json(event: Event) -> dict[str, Any]:
    """One event as `keel show --json` prints it: seq, type, at and the event's fields."""
    type_, data, body = encode_event(event)
    shown: dict[str, Any] = {"seq": event.seq, "type": type_, "at": event.at, **data}
    if isinstance(event, ToolResultRecorded):
        shown["content"] = body
        shown["elided"] = event.elided
    return shown


@dataclass(frozen=True, slots=True)
class ChildEvent:
    """An event of a child run (sub-agents, ADR 0046) in its parent's stream, with the child's
    run id: not an event of the parent's record (the child's own log has it)."""

    run_id: str
    event: Event

    def to_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, **event_json(self.event)}


class TreeListener:
    """A listener that also hears the runs its run delegates to (and theirs), each of their
    events as a `ChildEvent`. Plain listeners (progress lines, traces) hear their own run only."""

    __slots__ = ("hear",)

    def __init__(self, hear: Callable[[Any], None]) -> None:
        self.hear = hear

    def __call__(self, event: Any) -> None:
        self.hear(event)

    def for_child(self, run_id: str) -> TreeListener:
        def relay(event: Any) -> None:
            self.hear(event if isinstance(event, ChildEvent) else ChildEvent(run_id, event))

        return TreeListener(relay)


class LineSink(Protocol):
    """Where `--events` lines go: stdout, or anything that writes text."""

    def write(self, text: str, /) -> object: ...

    def flush(self) -> object: ...


class RunStream:
    """The events of one run as they happen, then (awaited) its result."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[Event | TextEvent | ChildEvent | None] = asyncio.Queue()
        self._handle: Any = None
        self._task: asyncio.Task[RunResult] | None = None
        """Set by `follow`, before the stream is handed out."""
        self._finished = False

    def listener(self, event: Event | TextEvent | ChildEvent) -> None:
        """Given to the run's recorder (and its text listeners): never blocks, never raises."""
        self._queue.put_nowait(event)

    def follow(self, handle: Any, task: asyncio.Task[RunResult]) -> RunStream:
        """Follow this run (its `RunHandle` and task): the stream ends when the task does."""
        self._handle, self._task = handle, task
        task.add_done_callback(lambda _: self._queue.put_nowait(_END))
        return self

    @property
    def run_id(self) -> str:
        run_id: str = self._handle.run_id
        return run_id

    def cancel(self) -> None:
        """Stop the run (cooperatively, as `RunHandle.cancel`); the stream then ends."""
        self._handle.cancel()

    def __aiter__(self) -> RunStream:
        return self

    async def __anext__(self) -> Event | TextEvent | ChildEvent:
        if self._finished:
            raise StopAsyncIteration
        event = await self._queue.get()
        if event is _END:
            self._finished = True
            if self._task is not None and not self._task.cancelled():
                error = self._task.exception()
                if error is not None:  # the run could not go on: LeaseHeld, LeaseLost, a bug
                    raise error
            raise StopAsyncIteration
        return event

    def __await__(self) -> Generator[Any, None, RunResult]:
        assert self._task is not None, "follow() a run first"
        return self._task.__await__()


def result_line(result: RunResult) -> str:
    """The last line of `--events`: the result, as `--json` prints it, typed `result`."""
    return json.dumps({"type": "result", **result.to_dict()}, ensure_ascii=False)


def stream_lines(
    out: LineSink,
) -> tuple[TreeListener, Callable[[RunResult], None]]:
    """A listener writing each event as a JSON line to `out` from a thread of its own, and a
    function that writes the result line once every event line is out, then stops the thread.
    The first write that fails (OSError, or ValueError on a closed stream) ends the writing;
    later lines are taken and dropped."""
    lines: queue.SimpleQueue[str | None] = queue.SimpleQueue()

    def write() -> None:
        broken = False
        while (line := lines.get()) is not None:
            if broken:
                continue
            try:
                out.write(line + "\n")
                out.flush()
            except (OSError, ValueError):
                broken = True

    writer = threading.Thread(target=write, name="keel-events", daemon=True)
    writer.start()

    def listener(event: Event | TextEvent | ChildEvent) -> None:
        shown = (
            event.to_json()
            if isinstance(event, TextDelta | TextDiscarded | ChildEvent)
            else event_json(event)
        )
        lines.put(json.dumps(shown, ensure_ascii=False))

    def finish(result: RunResult) -> None:
        lines.put(result_line(result))
        lines.put(None)
        writer.join()

    return TreeListener(listener), finish
