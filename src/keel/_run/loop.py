"""The run loop: a `while` over steps, each ending in one of a closed set of outcomes.

    open (create the run, start a queued one, or take a stored one over)
    keep the lease:  step -> Continue: step again (the next model attempt checkpoints first)
                          -> Completed | Paused | Failed: stop
                          -> Continue after `stop()` was asked: stop, the run still running
    end (record the outcome) and checkpoint, releasing the lease

What one step does lives in `step.py`; the model turn in `turns.py`; the batch in `batch.py`.
This module owns what lasts across steps: the run's state, its counters and context, the lease,
and the checkpoint. A lease lost mid-run raises LeaseLost out of `run` at once, without writing.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Coroutine
from typing import Any

from keel._run.batch import Batch
from keel._run.breaker import IdenticalCallBreaker
from keel._run.budgets import Clock
from keel._run.lease import Lease
from keel._run.live_text import LiveText, for_run
from keel._run.parts import (
    Completed,
    Continue,
    Failed,
    Paused,
    RunSetup,
    RunView,
    StepOutcome,
    StepParts,
)
from keel._run.recorder import StepRecorder
from keel._run.resume import ResumePoint
from keel._run.step import take_step
from keel.errors import StoreError, StoreUnavailable
from keel.messages import UserMessage
from keel.records import Ending, RunResumed, RunStarted, RunState
from keel.result import RunResult
from keel.store.cancels import CANCEL_POLL
from keel.transports.base import Resumable

__all__ = ["RunLoop", "RunSetup"]


class RunLoop:
    """Advances one run to its end."""

    def __init__(
        self,
        run_id: str,
        question: str,
        setup: RunSetup,
        resume: ResumePoint | None = None,
        *,
        queued: bool = False,
    ) -> None:
        """`queued`: the run was recorded by `keel submit` and has not started yet."""
        self.run_id = run_id
        self.queued = queued
        self.question = question
        self.setup = setup
        self.resume = resume
        state = resume.state if resume else RunState()
        # one provider cache key for the whole run, and for the conversation it continues
        setup.context.cache_key = setup.config.conversation_id or run_id
        self.lease = Lease(setup.store, run_id, setup.lease_ttl, setup.lease_owner)
        text_listeners, heard = for_run(run_id, setup.text_listeners)
        self.recorder = StepRecorder(run_id, setup.store, state, (*setup.listeners, *heard))
        breaker = IdenticalCallBreaker(
            setup.limits.loop_threshold,
            setup.limits.evidence_reset_cap,
            resume.counters if resume else None,
            policy=setup.limits.loop_policy,
            world=state.world,
            tiers=setup.limits.repeat_tiers,
            repeats=state.repeats,
        )
        self.parts = StepParts(
            setup=setup,
            state=state,
            breaker=breaker,
            recorder=self.recorder,
            clock=Clock(),
            checkpoint=self.checkpoint,
            live=LiveText.for_run(setup.transport, text_listeners),
        )
        if setup.price is not None and state.cost is None:
            state.cost = 0.0  # priced from here on
        self.view = RunView(run_id, self.parts)
        """What observers may read of this run besides its events."""
        self.batch: Batch | None = resume.batch if resume else None
        self.cancel_requested = False
        self.opened = False
        """The run is in the store and this loop holds its lease: from here a cancel cancels
        the task; before, it is only noted, and honoured once the run is open."""
        self.watch: tuple[str, ...] = (run_id,)
        """The runs whose cancel request stops this one: it and its ancestors."""
        self.task: asyncio.Task[object] | None = None
        """The task advancing the run (`run`'s): what a cancel from the store cancels."""
        self.stop_requested = False
        """Stop after the current step, the run left running and its lease released, for
        another process to continue (a worker shutting down)."""

    @property
    def state(self) -> RunState:
        return self.parts.state

    async def run(self) -> RunResult:
        self.task = asyncio.current_task()
        await self._open()
        self.opened = True
        outcome: StepOutcome | None = None
        try:
            self.watch, cancelled = await asyncio.to_thread(self._lineage)
            if cancelled:  # its tree was cancelled before it opened (a child started late)
                self.cancel_requested = True
            if not self.cancel_requested:  # a cancel that came before the run was open
                async with self.lease.kept(), watching(self):
                    outcome = await self._advance()
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if not self.cancel_requested or task is None:
                raise
            task.uncancel()
            outcome = None
        except StoreError as error:
            return self._unsaved(error)
        if not isinstance(outcome, Continue):  # Continue: stopped between steps, not ended
            self._end(outcome)
        try:
            await _saved_whatever_comes(self.checkpoint(release=True))
            if self.state.status == "cancelled" and self.setup.store is not None:
                await asyncio.to_thread(self.setup.store.forget_cancel, self.run_id)
        except StoreError as error:
            return self._unsaved(error)
        return self.state.result(self.run_id, self.setup.config.conversation_id)

    async def _cancel_recorded(self) -> bool:
        """A cancel of this run or a run above it is recorded in the store (cancels.py)."""
        store = self.setup.store
        if store is None:
            return False
        parent = self.setup.config.parent_run
        return await asyncio.to_thread(store.cancel_requested, self.run_id, parent)

    def _lineage(self) -> tuple[tuple[str, ...], bool]:
        """This run and the runs above it (a cancel request of any of them stops it), and
        whether one of them has one already."""
        store, found = self.setup.store, [self.run_id]
        if store is None:
            return (self.run_id,), False
        parent = self.setup.config.parent_run
        asked = store.cancel_requested(self.run_id, parent)
        while parent is not None and parent not in found:
            found.append(parent)
            record = store.get_run(parent)
            parent = None if record is None else record.config.parent_run
        return tuple(found), asked

    def cancel_from_store(self, task: asyncio.Task[object]) -> None:
        """A cancel recorded elsewhere (`keel cancel`, another process): as `RunHandle.cancel`."""
        if not self.cancel_requested:
            self.cancel_requested = True
            task.cancel()

    async def _advance(self) -> StepOutcome:
        """Steps until one ends the run. A step's additions are saved by the checkpoint that
        journals the next model attempt (before it is sent): one transaction per step."""
        while True:
            outcome = await take_step(self.parts, self.batch)
            self.batch = None
            if not isinstance(outcome, Continue) or self.stop_requested:
                return outcome

    async def checkpoint(self, release: bool = False) -> None:
        """Save the step so far. Every model attempt and side effect is preceded by one, so
        here a cancel recorded in the store (by any process) is honoured before either
        starts: at most the one call in flight when it was recorded runs on until stopped."""
        self.state.world = self.parts.breaker.world  # the breaker's, saved with the state
        self.state.repeats = self.parts.breaker.repeats
        task = self.task  # a side effect's checkpoint runs in its tool's task: not this one
        watched = not release and self.opened and not self.cancel_requested and task is not None
        found = await self.recorder.checkpoint(
            self.parts.breaker.take_dirty(),
            self.lease.owner,
            self.lease.ttl,
            release=release,
            watch=self.watch if watched else (),
        )
        if found and task is not None:
            self.cancel_from_store(task)
            if asyncio.current_task() is task:
                await asyncio.sleep(0)  # the cancel lands here, after the save

    # -- the two ends ------------------------------------------------------------------------

    async def _open(self) -> None:
        """Create the run, or take over a stored one: lease, history, counters, elisions."""
        limits, context, emit = self.setup.limits, self.parts.context, self.recorder.emit
        if self.state.deadline_at is None and limits.deadline is not None:
            self.state.deadline_at = time.time() + limits.deadline  # kept across resumes
        self.parts.clock.deadline_at = self.state.deadline_at
        name = self.setup.transport.name
        if self.resume is None:
            emit(RunStarted(question=self.question, model=name, owner=self.lease.owner))
            context.append(UserMessage(self.question))
            if self.queued:  # `keel submit` created it; a worker takes it now
                await self.lease.acquire()
                await self.checkpoint()
            else:  # the run and its question, durable before the first model call: one commit
                await self.recorder.start(
                    self.question, name, self.setup.config, self.lease.owner, self.lease.ttl
                )
            return
        await self.lease.acquire()
        context.elided.update(self.resume.elided)
        context.extend(self.resume.history)
        transport = self.setup.transport
        if isinstance(transport, Resumable) and self.state.transport is not None:
            transport.restore(self.state.transport)
        self.state.status = "running"
        open_calls = len(self.batch.open_calls()) if self.batch else 0
        emit(
            RunResumed(
                step=self.state.step, model=name, open_calls=open_calls, owner=self.lease.owner
            )
        )

    def _unsaved(self, error: StoreError) -> RunResult:
        """The store could not save a step (disk full, file gone). This process stops here and
        says so; the stored run stays at its last saved step, so it can be resumed once the
        store is writable again. Nothing more is written: the store just refused."""
        state = self.state.copy()
        state.end(Ending.failed(StoreUnavailable(str(error), step=self.state.step)))
        return state.result(self.run_id, self.setup.config.conversation_id)

    def _end(self, outcome: StepOutcome | None) -> None:
        """Record how the run ended; None: it was cancelled."""
        step = self.state.step
        match outcome:
            case Completed(
                answer, synthesized, cut_off, output, gaps, evidence, unsupported, sources
            ):
                ending = Ending.completed(
                    step,
                    answer,
                    synthesized,
                    cut_off=cut_off,
                    output=output,
                    gaps=gaps,
                    evidence=evidence,
                    unsupported=unsupported,
                    sources=[dataclasses.asdict(s) for s in sources] or None,
                )
            case Paused(_, children):
                ending = Ending.paused(step, children)
            case Failed(failure):
                ending = Ending.failed(failure)
            case None:
                ending = Ending.cancelled(step)
            case Continue():
                raise AssertionError("a run does not end on Continue")
        self.state.end(ending)
        event = ending.event()
        if event is not None:
            self.recorder.emit(event)


@contextlib.asynccontextmanager
async def watching(loop: RunLoop) -> AsyncIterator[None]:
    """While the body runs, look at the store for a cancel of the run's tree every
    CANCEL_POLL seconds; one found cancels the run as `RunHandle.cancel` does."""
    task = asyncio.current_task()
    if loop.setup.store is None or task is None:
        yield
        return

    async def watch() -> None:
        while True:
            await asyncio.sleep(CANCEL_POLL)
            try:
                found = await loop._cancel_recorded()
            except StoreError:
                continue  # the next checkpoint says what is wrong with the store
            if found:
                loop.cancel_from_store(task)
                return

    watcher = asyncio.create_task(watch())
    try:
        yield
    finally:
        watcher.cancel()


async def _saved_whatever_comes(save: Coroutine[Any, Any, None]) -> None:
    """The run's last checkpoint, saved whole even when a cancel (a SIGTERM) lands while it
    is written: the run has ended by then, and its ending stands (ADR 0062 saw a
    CancelledError traceback here)."""
    saving = asyncio.ensure_future(save)
    task = asyncio.current_task()
    while True:
        try:
            await asyncio.shield(saving)
            return
        except asyncio.CancelledError:
            if saving.cancelled() or task is None:
                raise
            task.uncancel()  # a cancel after the ending changes nothing: save it
