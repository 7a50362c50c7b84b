"""Answering a batch: denials, approvals, dispatch, uncertain effects, results, evidence resets.

Every call of a batch gets exactly one result, in request order. Before a side-effecting call is
dispatched, the step so far is checkpointed with a `tool_dispatched` journal entry; if the
process dies before the call's result is saved, the resumed run answers it "effect unknown"
instead of running it again. Read-only and observation calls interrupted by a crash simply run
again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from keel.failpoints import failpoint
from keel.messages import ToolCall, ToolResult, digest_text
from keel.result import PendingApproval
from keel.state import pending_dict
from keel.tools.base import Effect, Tool
from keel.tools.executor import ExecutedCall

if TYPE_CHECKING:
    from keel.loop import RunLoop


@dataclass(slots=True)
class Batch:
    """The tool calls of one model turn, and what is already known about them."""

    calls: list[ToolCall]
    answered: dict[str, ToolResult] = field(default_factory=dict)
    """Results already recorded (a resumed batch), by call id."""
    journaled: set[str] = field(default_factory=set)
    """Side-effecting calls dispatched earlier whose results were never recorded."""

    def open_calls(self) -> list[ToolCall]:
        return [c for c in self.calls if c.id not in self.answered]


class AwaitingApproval(Exception):
    """Some calls of the batch wait for a person's decision; the run pauses."""


def denial_text(call: ToolCall, by: str, reason: str | None, again: bool) -> str:
    why = f": {reason}" if reason else ""
    first = (
        f"Denied again without asking: {by} already denied this identical call{why}."
        if again
        else f"Denied by {by}{why}."
    )
    return (
        f"{first} The call {call.name} was not run. Do not request it again; continue "
        "without it, or answer with what you have."
    )


def uncertain_text(call: ToolCall) -> str:
    return (
        f"Effect unknown: {call.name} was dispatched, but the process stopped before its result "
        "was recorded. It was not run again, so it may or may not have taken effect. Check its "
        "effect before relying on it, and do not repeat it blindly."
    )


class BatchAnswerer:
    def __init__(self, run: RunLoop, approve_tools: frozenset[str] = frozenset()) -> None:
        self.run = run
        self.approve_tools = approve_tools

    async def answer(self, batch: Batch) -> None:
        run = self.run
        self._ask_approvals(batch)
        results: dict[str, ToolResult] = dict(batch.answered)
        to_run: list[ToolCall] = []
        for call in batch.open_calls():
            text = self._refusal(call, batch)
            if text is None:
                to_run.append(call)
                continue
            uncertain = call.id in batch.journaled
            if uncertain:  # dispatched before the crash: spent, though its effect is unknown
                run.state.tool_calls += 1
            results[call.id] = self._record(
                ToolResult(
                    call.id,
                    call.name,
                    call.key,
                    text,
                    is_error=True,
                    size=len(text),
                    digest=digest_text(text),
                    uncertain=uncertain,
                )
            )
        allowed = len(to_run)
        if run.limits.max_tool_calls is not None:
            allowed = max(0, min(allowed, run.limits.max_tool_calls - run.state.tool_calls))

        async def close_journal(item: ExecutedCall) -> None:
            """A side effect's result is saved at once: it closes the call's journal entry."""
            results[item.call.id] = self._record_executed(item)
            await run.checkpoint()

        executed = await run.executor.run_batch(
            to_run[:allowed],
            deadline=run.deadline_at,
            on_dispatch=self._journal,
            on_effect=close_journal,
        )
        for item in executed:
            if item.call.id not in results:
                results[item.call.id] = self._record_executed(item)
        for call in to_run[allowed:]:
            text = "not run: the run's tool-call budget is spent"
            results[call.id] = self._record(
                ToolResult(call.id, call.name, call.key, text, is_error=True, size=len(text))
            )
        for call in batch.calls:  # the model reads results in request order
            run.context.append(results[call.id])
        self._apply_evidence_resets(executed)
        failpoint("after_results")

    # -- approvals and refusals --------------------------------------------------------------

    def _ask_approvals(self, batch: Batch) -> None:
        """Pause if a call needs a decision nobody has made yet. The breaker already ran."""
        state = self.run.state
        waiting = []
        for call in batch.open_calls():
            if call.id in state.decisions or call.key in state.denied:
                continue
            if call.id in batch.journaled:
                continue
            tool = self.run.executor.get(call.name)
            if tool is not None and self._needs_approval(tool, call):
                waiting.append(PendingApproval(call.id, call.name, call.arguments, call.key))
        if not waiting:
            state.pending = ()
            return
        asked = {p.call_id for p in state.pending}
        for pending in waiting:
            if pending.call_id not in asked:
                self.run.emit("approval_requested", {"step": state.step, **pending_dict(pending)})
        state.pending = tuple(waiting)
        raise AwaitingApproval

    def _needs_approval(self, tool: Tool, call: ToolCall) -> bool:
        if tool.name in self.approve_tools or not isinstance(call.arguments, dict):
            return False
        return tool.needs_approval(call.arguments)

    def _refusal(self, call: ToolCall, batch: Batch) -> str | None:
        """The text answering a call that must not run, or None when it may run."""
        state = self.run.state
        decision = state.decisions.get(call.id)
        if decision is not None and not decision["approved"]:
            state.denied[call.key] = {"by": decision["by"], "reason": decision["reason"]}
            return denial_text(call, decision["by"], decision["reason"], again=False)
        if decision is None and call.key in state.denied:
            denial = state.denied[call.key]
            return denial_text(call, denial["by"], denial["reason"], again=True)
        if call.id in batch.journaled:
            return uncertain_text(call)
        return None

    # -- recording ---------------------------------------------------------------------------

    async def _journal(self, call: ToolCall, tool: Tool) -> None:
        """Before a side effect: make the step so far durable, with an entry naming the call."""
        if tool.effect is not Effect.SIDE_EFFECTING:
            return
        run = self.run
        run.emit(
            "tool_dispatched",
            {"step": run.state.step, "call_id": call.id, "call_key": call.key, "name": call.name},
        )
        await run.checkpoint()
        failpoint("after_journal")

    def _record_executed(self, executed: ExecutedCall) -> ToolResult:
        """A call the executor answered: it counts against the tool-call budget."""
        self.run.state.tool_calls += 1
        result = executed.result
        if executed.full_content is not None:
            self.run.recorder.whole_text(result.digest, executed.full_content)
        return self._record(result, executed.duration_ms)

    def _record(self, result: ToolResult, duration_ms: float = 0.0) -> ToolResult:
        self.run.recorder.tool_result(result, duration_ms)
        return result

    def _apply_evidence_resets(self, executed: list[ExecutedCall]) -> None:
        run = self.run
        for item in executed:
            tool = run.executor.get(item.call.name)
            if tool is None or tool.effect is not Effect.OBSERVATION or item.result.is_error:
                continue
            if run.breaker.observe(item.call.key, item.result.digest):
                counter = run.breaker.counters[item.call.key]
                run.emit(
                    "evidence_reset",
                    {"step": run.state.step, "call_key": item.call.key, "resets": counter.resets},
                )
