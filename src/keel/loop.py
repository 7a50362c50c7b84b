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

from keel.breaker import IdenticalCallBreaker
from keel.context import ContextBuilder
from keel.errors import BudgetExhausted, DeadlineExceeded, RunFailure, ToolLoopDetected
from keel.limits import Limits
from keel.messages import (
    AssistantMessage,
    ModelResponse,
    ToolCall,
    ToolResult,
    UserMessage,
)
from keel.recorder import Listener, StepRecorder
from keel.result import Failure, PendingApproval, RunResult, RunStatus
from keel.state import RunState, pending_dict
from keel.store import Store
from keel.synthesis import Mode, decide_mode
from keel.tools.executor import ExecutedCall, ToolExecutor
from keel.transports.base import Transport
from keel.turns import ModelTurns


class _Stop(Exception):
    """Internal: the step ended the run with this outcome (completed or paused)."""

    def __init__(self, status: RunStatus) -> None:
        self.status = status


class RunLoop:
    """Advances one run to its end. Owns the breaker, the context and the step's checkpoint."""

    def __init__(
        self,
        *,
        run_id: str,
        question: str,
        transport: Transport,
        executor: ToolExecutor,
        limits: Limits,
        context: ContextBuilder,
        store: Store | None,
        listeners: tuple[Listener, ...] = (),
    ) -> None:
        self.run_id = run_id
        self.question = question
        self.transport = transport
        self.executor = executor
        self.limits = limits
        self.context = context
        self.state = RunState()
        self.recorder = StepRecorder(run_id, store, self.state, listeners)
        self.emit = self.recorder.emit
        self.breaker = IdenticalCallBreaker(limits.loop_threshold, limits.evidence_reset_cap)
        self.turns = ModelTurns(self)
        self.cancel_requested = False
        self._deadline_at: float | None = None

    # -- the loop ---------------------------------------------------------------------------

    async def run(self) -> RunResult:
        loop = asyncio.get_running_loop()
        if self.limits.deadline is not None:
            self._deadline_at = loop.time() + self.limits.deadline
        await self.recorder.start(self.question, self.transport.name, self.limits.to_dict())
        self.emit("run_started", {"question": self.question, "model": self.transport.name})
        self.context.append(UserMessage(self.question))
        try:
            while True:
                self.state.step += 1
                await self._step()
                await self.recorder.checkpoint(self.breaker.take_dirty())
        except _Stop as stop:
            self.state.status = stop.status
        except RunFailure as failure:
            self._fail(failure)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if not self.cancel_requested or task is None:
                raise
            task.uncancel()
            self.state.status = "cancelled"
            self.emit("run_cancelled", {"step": self.state.step})
        await asyncio.shield(self.recorder.checkpoint(self.breaker.take_dirty()))
        return self.result()

    async def _step(self) -> None:
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
        if pending := self._needs_approval(calls):
            self.state.pending = pending
            for p in pending:
                self.emit("approval_requested", {"step": self.state.step, **pending_dict(p)})
            raise _Stop("awaiting_approval")
        await self._dispatch(calls)

    def check_stop(self) -> None:
        """Step 1: deadline and hard budgets. Cancellation arrives as CancelledError."""
        if self._deadline_at is not None and asyncio.get_running_loop().time() >= self._deadline_at:
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

    def _needs_approval(self, calls: list[ToolCall]) -> tuple[PendingApproval, ...]:
        pending = []
        for call in calls:
            tool = self.executor.get(call.name)
            if (
                tool is not None
                and isinstance(call.arguments, dict)
                and tool.needs_approval(call.arguments)
            ):
                pending.append(PendingApproval(call.id, call.name, call.arguments, call.key))
        return tuple(pending)

    async def _dispatch(self, calls: list[ToolCall]) -> None:
        allowed = len(calls)
        if self.limits.max_tool_calls is not None:
            allowed = max(0, min(allowed, self.limits.max_tool_calls - self.state.tool_calls))
        executed = await self.executor.run_batch(calls[:allowed], deadline=self._deadline_at)
        for item in executed:
            self._record_result(item)
        for call in calls[allowed:]:
            self._record_refused(call, "not run: the run's tool-call budget is spent")
        self.state.tool_calls += allowed
        self._apply_evidence_resets(executed)
        if self._deadline_at is not None and asyncio.get_running_loop().time() >= self._deadline_at:
            self.check_stop()

    def _record_result(self, executed: ExecutedCall) -> None:
        result = executed.result
        self.context.append(result)
        if executed.full_content is not None:
            self.recorder.whole_text(result.digest, executed.full_content)
        self.recorder.tool_result(result, executed.duration_ms)

    def _record_refused(self, call: ToolCall, message: str) -> None:
        result = ToolResult(call.id, call.name, call.key, message, is_error=True, size=len(message))
        self.context.append(result)
        self.recorder.tool_result(result)

    def _apply_evidence_resets(self, executed: list[ExecutedCall]) -> None:
        for item in executed:
            tool = self.executor.get(item.call.name)
            if tool is None or tool.effect != "observation" or item.result.is_error:
                continue
            if self.breaker.observe(item.call.key, item.result.digest):
                counter = self.breaker.counters[item.call.key]
                self.emit(
                    "evidence_reset",
                    {"step": self.state.step, "call_key": item.call.key, "resets": counter.resets},
                )

    # -- endings ---------------------------------------------------------------------------

    def _fail(self, failure: RunFailure) -> None:
        self.state.status = "failed"
        self.state.failure = Failure(failure.kind, failure.message, failure.step, failure.details)
        self.emit("run_failed", failure.to_dict())

    def result(self) -> RunResult:
        return self.state.result(self.run_id)

    def remaining_time(self) -> float | None:
        if self._deadline_at is None:
            return None
        return max(0.0, self._deadline_at - asyncio.get_running_loop().time())


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
