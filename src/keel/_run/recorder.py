"""What one step adds to the record, gathered and saved in one checkpoint.

Listeners (progress display, logging, the caller's event stream) see each typed event as it
happens; the store gets the step's events, changed counters, new elisions and whole texts
together, in one transaction.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from keel import ledger
from keel._run.breaker import Restart
from keel._run.context import Clamp
from keel.messages import ToolResult
from keel.records import (
    Event,
    EvidenceReset,
    KeyCounter,
    ResultClamped,
    ResultElided,
    RunConfig,
    RunState,
    ToolResultRecorded,
)
from keel.store import Checkpoint, RunStore

__all__ = ["Listener", "StepRecorder"]

Listener = Callable[[Event], None]


class StepRecorder:
    def __init__(
        self, run_id: str, store: RunStore | None, state: RunState, listeners: tuple[Listener, ...]
    ) -> None:
        self.run_id = run_id
        self.store = store
        self.state = state
        self.listeners = listeners
        self._events: list[Event] = []
        self._elisions: list[tuple[str, int]] = []
        self._blobs: list[tuple[str, str]] = []

    def emit(self, event: Event) -> None:
        """Log an event for this step's checkpoint, fold it into the run's state (the
        ledger), and show it to listeners."""
        event.seq = self.state.next_seq
        event.at = time.time()
        self.state.next_seq += 1
        self._events.append(event)
        ledger.apply(self.state, event)
        for listener in self.listeners:
            listener(event)

    def tool_result(
        self,
        result: ToolResult,
        duration_ms: float = 0.0,
        *,
        answered_by: str | None = None,
        spent: bool = False,
    ) -> None:
        """`answered_by`: the person whose text is the result (an answer instead, ADR 0052);
        `spent`: the call counts against the tool-call budget (it ran, or its effect is
        unknown)."""
        self.emit(
            ToolResultRecorded(
                step=self.state.step,
                call_id=result.call_id,
                call_key=result.call_key,
                name=result.name,
                content=result.content,
                is_error=result.is_error,
                size=result.size,
                digest=result.digest,
                truncated=result.truncated,
                uncertain=result.uncertain,
                duration_ms=round(duration_ms, 3),
                answered_by=answered_by,
                spent=spent,
            )
        )

    def restarted(self, restart: Restart) -> None:
        """A key's counter restarted at 1 (keel._run.breaker), and why."""
        self.emit(
            EvidenceReset(
                step=self.state.step,
                call_key=restart.key,
                resets=restart.resets,
                reason=restart.reason,
            )
        )

    def whole_text(self, digest: str, text: str) -> None:
        """Keep the full text of a result the model sees truncated."""
        self._blobs.append((digest, text))

    def elided(self, results: list[ToolResult]) -> None:
        for result in results:
            self._elisions.append((result.call_id, self.state.step))
            self.emit(
                ResultElided(
                    step=self.state.step,
                    call_id=result.call_id,
                    call_key=result.call_key,
                    size=result.size,
                    digest=result.digest,
                )
            )

    def clamped(self, clamps: list[Clamp]) -> None:
        """Results of the latest batch shown cut to fit the model's window (keel._run.context)."""
        for clamp in clamps:
            result = clamp.result
            self.emit(
                ResultClamped(
                    step=self.state.step,
                    call_id=result.call_id,
                    call_key=result.call_key,
                    size=result.size,
                    shown=clamp.shown_chars,
                )
            )

    async def start(
        self, question: str, model: str, config: RunConfig, lease: str | None, ttl: float
    ) -> None:
        """Create the run with the events logged so far (the question), in one transaction."""
        events, self._events = self._events, []
        if self.store is not None:
            await self.store.create_run(
                self.run_id,
                question,
                model,
                config,
                self.state.copy(),
                lease=lease,
                lease_ttl=ttl,
                events=events,
            )

    async def checkpoint(
        self,
        counters: dict[str, KeyCounter],
        lease: str | None,
        lease_ttl: float,
        *,
        release: bool = False,
        watch: tuple[str, ...] = (),
    ) -> bool:
        """Save what the step added, and only that, in one transaction; True when a run of
        `watch` has a cancel request (looked up in the same transaction)."""
        checkpoint = Checkpoint(
            run_id=self.run_id,
            state=self.state.copy(),  # the worker thread encodes it later
            events=self._events,
            counters=counters,
            elisions=self._elisions,
            blobs=self._blobs,
            lease=lease,
            lease_ttl=lease_ttl,
            release=release,
            watch=watch,
        )
        self._events, self._elisions, self._blobs = [], [], []
        if self.store is not None:
            await self.store.save_step(checkpoint)
        return checkpoint.cancel_found
