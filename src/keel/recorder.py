"""What one step adds to the record, gathered and saved in one checkpoint.

Listeners (progress display, logging) see each event as it happens; the store gets the step's
events, changed counters, new elisions and whole texts together, in one transaction.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from keel.breaker import KeyCounter
from keel.messages import ToolResult
from keel.state import RunState
from keel.store import Checkpoint, Event, Store

Listener = Callable[[str, dict[str, Any]], None]


class StepRecorder:
    def __init__(
        self, run_id: str, store: Store | None, state: RunState, listeners: tuple[Listener, ...]
    ) -> None:
        self.run_id = run_id
        self.store = store
        self.state = state
        self.listeners = listeners
        self._events: list[Event] = []
        self._elisions: list[tuple[str, int]] = []
        self._blobs: list[tuple[str, str]] = []

    def emit(self, type_: str, data: dict[str, Any], body: str | None = None) -> None:
        """Record an event for this step's checkpoint and show it to listeners.

        `body`, a large text, is stored beside the event's JSON and shown as its "content".
        """
        self._events.append(Event(self.state.next_seq, type_, time.time(), data, body))
        self.state.next_seq += 1
        if self.listeners:
            shown = data if body is None else {**data, "content": body}
            for listener in self.listeners:
                listener(type_, shown)

    def tool_result(self, result: ToolResult, duration_ms: float = 0.0) -> None:
        self.emit(
            "tool_result",
            {
                "step": self.state.step,
                "call_id": result.call_id,
                "call_key": result.call_key,
                "name": result.name,
                "is_error": result.is_error,
                "size": result.size,
                "digest": result.digest,
                "truncated": result.truncated,
                "uncertain": result.uncertain,
                "duration_ms": round(duration_ms, 3),
            },
            body=result.content,
        )

    def whole_text(self, digest: str, text: str) -> None:
        """Keep the full text of a result the model sees truncated."""
        self._blobs.append((digest, text))

    def elided(self, results: list[ToolResult]) -> None:
        for result in results:
            self._elisions.append((result.call_id, self.state.step))
            self.emit(
                "result_elided",
                {
                    "step": self.state.step,
                    "call_id": result.call_id,
                    "call_key": result.call_key,
                    "size": result.size,
                    "digest": result.digest,
                },
            )

    async def start(
        self, question: str, model: str, config: dict[str, Any], lease: str | None, ttl: float
    ) -> None:
        if self.store is not None:
            await self.store.create_run(
                self.run_id,
                question,
                model,
                config,
                self.state.to_dict(),
                lease=lease,
                lease_ttl=ttl,
            )

    async def checkpoint(
        self,
        counters: dict[str, KeyCounter],
        lease: str | None,
        lease_ttl: float,
        *,
        release: bool = False,
    ) -> None:
        """Save what the step added, and only that, in one transaction."""
        checkpoint = Checkpoint(
            run_id=self.run_id,
            status=self.state.status,
            state=self.state.to_dict(),
            events=self._events,
            counters=counters,
            elisions=self._elisions,
            blobs=self._blobs,
            lease=lease,
            lease_ttl=lease_ttl,
            release=release,
        )
        self._events, self._elisions, self._blobs = [], [], []
        if self.store is not None:
            await self.store.save_step(checkpoint)
