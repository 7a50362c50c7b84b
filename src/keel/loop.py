"""The run loop: a `while` over steps, each ending in one of a closed set of outcomes.

One step (SYSTEM.md, "One step of the run loop"):
  1. stop if cancelled, past the deadline or out of budget;
  2. decide the mode of the next turn (normal, repeated-tool or budget synthesis);
  3. build the context and call the model, retrying what is retryable;
  4. text and no tool calls: completed;
  5. tool calls in a synthesis-only turn: failed, before any dispatch;
  6. otherwise the hard breaker over the whole batch, approvals, dispatch, results, resets;
  7. checkpoint the step in one transaction.
The model-turn details (retries, empty turns) live in `turns.py`; this module decides.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from keel.batch import AwaitingApproval, Batch, BatchAnswerer
from keel.breaker import IdenticalCallBreaker
from keel.context import ContextBuilder
from keel.errors import BudgetExhausted, DeadlineExceeded, RunFailure, ToolLoopDetected
from keel.failpoints import failpoint
from keel.limits import Limits
from keel.messages import AssistantMessage, ModelResponse, ToolCall, UserMessage
from keel.recorder import Listener, StepRecorder
from keel.result import Failure, RunResult, RunStatus
from keel.resume import ResumePoint
from keel.state import RunState
from keel.store import Store, new_lease_owner
from keel.synthesis import Mode, decide_mode
from keel.tools.executor import ToolExecutor
from keel.transports.base import Transport
from keel.turns import ModelTurns


class _Stop(Exception):
    """Internal: the step ended the run with this outcome (completed or paused)."""

    def __init__(self, status: RunStatus) -> None:
        self.status = status


@dataclass(frozen=True, slots=True)
class RunSetup:
    """Everything a run needs besides its question: the same for a new run and a resumed one."""

    transport: Transport
    executor: ToolExecutor
    limits: Limits
    context: ContextBuilder
    store: Store | None
    listeners: tuple[Listener, ...] = ()
    approve_tools: frozenset[str] = frozenset()
    """Tools whose calls are pre-approved for this run."""
    config: dict[str, Any] = field(default_factory=dict)
    """What `keel resume` needs to rebuild the run (no secrets)."""
    lease_ttl: float = 30.0


class RunLoop:
    """Advances one run to its end. Owns the breaker, the context and the step's checkpoint."""

    def __init__(
        self, run_id: str, question: str, setup: RunSetup, resume: ResumePoint | None = None
    ) -> None:
        self.run_id = run_id
        self.question = question
        self.setup = setup
        self.transport = setup.transport
        self.executor = setup.executor
        self.limits = setup.limits
        self.context = setup.context
        self.state = resume.state if resume else RunState()
        self.lease = new_lease_owner() if setup.store is not None else None
        self.recorder = StepRecorder(run_id, setup.store, self.state, setup.listeners)
        self.emit = self.recorder.emit
        self.breaker = IdenticalCallBreaker(
            self.limits.loop_threshold,
            self.limits.evidence_reset_cap,
            resume.counters if resume else None,
        )
        self.turns = ModelTurns(self)
        self.batches = BatchAnswerer(self, setup.approve_tools)
        self.resume = resume
        self.batch: Batch | None = resume.batch if resume else None
        self.cancel_requested = False
        self.deadline_at: float | None = None

    # -- the loop ---------------------------------------------------------------------------

    async def run(self) -> RunResult:
        if self.limits.deadline is not None:
            self.deadline_at = asyncio.get_running_loop().time() + self.limits.deadline
        await self._open()
        heartbeat = asyncio.create_task(self._heartbeat())
        try:
            while True:
                if self.batch is None:
                    self.state.step += 1
                    failpoint("step_start")
                    self.batch = await self._turn()
                await self.batches.answer(self.batch)
                self.batch = None
                await self.checkpoint()
                failpoint("after_checkpoint")
        except _Stop as stop:
            self.state.status = stop.status
        except AwaitingApproval:
            self.state.status = "awaiting_approval"
        except RunFailure as failure:
            self._fail(failure)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if not self.cancel_requested or task is None:
                raise
            task.uncancel()
            self.state.status = "cancelled"
            self.emit("run_cancelled", {"step": self.state.step})
        finally:
            heartbeat.cancel()
        await asyncio.shield(self.checkpoint(release=True))
        return self.result()

    async def _open(self) -> None:
        """Create the run, or take over a stored one: lease, history, counters, elisions."""
        setup = self.setup
        if self.resume is None:
            await self.recorder.start(
                self.question, self.transport.name, setup.config, self.lease, setup.lease_ttl
            )
            self.emit("run_started", {"question": self.question, "model": self.transport.name})
            self.context.append(UserMessage(self.question))
            await self.checkpoint()  # the question is durable before the first model call
            return
        if setup.store is not None and self.lease is not None:
            await setup.store.acquire_lease(self.run_id, self.lease, setup.lease_ttl)
        self.context.elided.update(self.resume.elided)
        self.context.extend(self.resume.history)
        restore = getattr(self.transport, "restore", None)
        if restore is not None and self.state.transport is not None:
            restore(self.state.transport)
        self.state.status = "running"
        self.emit(
            "run_resumed",
            {
                "step": self.state.step,
                "model": self.transport.name,
                "open_calls": len(self.batch.open_calls()) if self.batch else 0,
            },
        )

    async def _heartbeat(self) -> None:
        """Renew the lease while a long call runs; checkpoints renew it too."""
        store, lease = self.setup.store, self.lease
        if store is None or lease is None:
            return
        while True:
            await asyncio.sleep(self.setup.lease_ttl / 3)
            await store.renew_lease(self.run_id, lease, self.setup.lease_ttl)

    async def checkpoint(self, release: bool = False) -> None:
        await self.recorder.checkpoint(
            self.breaker.take_dirty(), self.lease, self.setup.lease_ttl, release=release
        )

    async def _turn(self) -> Batch:
        """One model turn: the answer ends the run; tool calls become the step's batch."""
        self.check_stop()
        response, mode = await self.turns.next_turn()
        if not response.tool_calls:
            self.state.answer = response.text
            self.state.synthesized = mode.reason
            self.emit(
                "run_completed",
                {"step": self.state.step, "answer": response.text, "synthesized": mode.reason},
            )
            raise _Stop("completed")
        if mode.reason is not None:
            self._refuse_synthesis_tools(response, mode)
        self.context.append(
            AssistantMessage(response.text, response.tool_calls, response.provider_details)
        )
        calls = list(response.tool_calls)
        self._check_breaker(calls)
        self.breaker.record(call.key for call in calls)
        for call in calls:
            self.emit(
                "tool_call",
                {
                    "step": self.state.step,
                    "call_id": call.id,
                    "name": call.name,
                    "arguments": call.arguments if call.parse_error is None else call.raw_arguments,
                    "call_key": call.key,
                },
            )
        return Batch(calls)

    def check_stop(self) -> None:
        """Step 1: deadline and hard budgets. Cancellation arrives as CancelledError."""
        if self.deadline_at is not None and asyncio.get_running_loop().time() >= self.deadline_at:
            raise DeadlineExceeded(
                f"the run passed its deadline of {self.limits.deadline:g}s",
                step=self.state.step,
                details={"deadline": self.limits.deadline},
            )
        limit = self.limits.max_model_calls
        if limit is not None and self.state.model_calls >= limit:
            raise BudgetExhausted(
                f"all {limit} model calls of the budget were spent before an answer",
                step=self.state.step,
                details={"budget": "model_calls", "limit": limit},
            )
        tokens = self.limits.max_tokens
        if tokens is not None and self.state.usage.total >= tokens:
            raise BudgetExhausted(
                f"the token budget of {tokens} was spent ({self.state.usage.total} used) "
                "before an answer",
                step=self.state.step,
                details={"budget": "tokens", "limit": tokens},
            )

    def mode(self) -> Mode:
        """Step 2, asked again before every attempt: a retry may only move toward synthesis."""
        return decide_mode(self.breaker.synthesis_key(), self._budget_running_out())

    def _budget_running_out(self) -> str | None:
        s, lim = self.state, self.limits
        if lim.max_model_calls is not None and lim.max_model_calls - s.model_calls <= 1:
            return "model_calls"
        if lim.max_tool_calls is not None and s.tool_calls >= lim.max_tool_calls:
            return "tool_calls"
        if lim.max_tokens is not None and (
            lim.max_tokens - s.usage.total < 2 * self.context.total_tokens
        ):
            return "tokens"
        return None

    def _refuse_synthesis_tools(self, response: ModelResponse, mode: Mode) -> None:
        names = sorted({c.name for c in response.tool_calls})
        details = {"reason": mode.reason, "requested": names}
        if mode.reason == "budget":
            raise BudgetExhausted(
                f"the {mode.budget} budget allowed only a final answer, but the model asked for "
                f"{', '.join(names)} instead; nothing was run",
                step=self.state.step,
                details={**details, "budget": mode.budget},
            )
        key = mode.repeated_key or ""
        raise ToolLoopDetected(
            f"research was repeating ({key[:120]} was requested {self.breaker.count(key)} times) "
            f"and the model asked for {', '.join(names)} in its final synthesis turn instead of "
            "answering; nothing was run",
            step=self.state.step,
            details={
                **details,
                "call_key": key,
                "count": self.breaker.count(key),
                "threshold": self.limits.loop_threshold,
            },
        )

    def _check_breaker(self, calls: list[ToolCall]) -> None:
        tripped = self.breaker.first_tripping_key([c.key for c in calls])
        if tripped is None:
            return
        key, count = tripped
        raise ToolLoopDetected(
            f"the model requested the identical call {key[:120]} a {_ordinal(count)} time, "
            f"reaching the limit of {self.limits.loop_threshold}; the batch of {len(calls)} "
            "call(s) was not run",
            step=self.state.step,
            details={"call_key": key, "count": count, "threshold": self.limits.loop_threshold},
        )

    # -- endings ---------------------------------------------------------------------------

    def _fail(self, failure: RunFailure) -> None:
        self.state.status = "failed"
        self.state.failure = Failure(failure.kind, failure.message, failure.step, failure.details)
        self.emit("run_failed", failure.to_dict())

    def result(self) -> RunResult:
        return self.state.result(self.run_id)

    def remaining_time(self) -> float | None:
        if self.deadline_at is None:
            return None
        return max(0.0, self.deadline_at - asyncio.get_running_loop().time())


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
