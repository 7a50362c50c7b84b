"""Answering a batch: denials, approvals, dispatch, uncertain effects, results, evidence resets.

A side-effecting call whose effect is unknown (it timed out with its work still running, the
process crashed, the run was cancelled while it ran) is remembered by its call key: an
identical call later in the run waits for a person's decision even when its tool is
pre-approved, and the approver is told the first one may have happened (ADR 0033).

Every call of a batch gets exactly one result, in request order. Before a side-effecting call is
dispatched, the step so far is checkpointed with a `tool_dispatched` journal entry; if the
process dies before the call's result is saved, the resumed run answers it "effect unknown"
instead of running it again. Read-only and observation calls interrupted by a crash simply run
again. Calls, their decisions and their journal entries are matched by Keel's own call id,
never the provider's (which a provider may repeat).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from keel._run import decisions, hooks
from keel._run.parts import StepParts
from keel._run.tree import CURRENT, Delegations
from keel.errors import ToolError
from keel.failpoints import failpoint
from keel.informative import says_nothing
from keel.ledger import BUDGET_REFUSAL
from keel.messages import ToolCall, ToolResult, digest_text
from keel.records import ApprovalRequested, Decision, ToolDispatched
from keel.result import PendingApproval
from keel.tools.base import Effect, Tool
from keel.tools.executor import ExecutedCall

__all__ = ["Batch", "answer", "ask_approvals", "denial_text", "uncertain_text"]


@dataclass(slots=True)
class Batch:
    """The tool calls of one model turn, and what is already known about them."""

    calls: list[ToolCall]
    answered: dict[str, ToolResult] = field(default_factory=dict)
    """Results already recorded (a resumed batch), by Keel's call id (unique in the run, unlike
    a provider's: ADR 0030)."""
    journaled: set[str] = field(default_factory=set)
    """Side-effecting calls dispatched earlier whose results were never recorded, by Keel's id."""
    refused: dict[str, str] = field(default_factory=dict)
    """Calls answered with an error without running, by call id: their approval check failed."""

    def open_calls(self) -> list[ToolCall]:
        return [c for c in self.calls if c.id not in self.answered]


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
        f"Effect unknown: {call.name} was dispatched, but the run stopped (a crash or an "
        "interruption) before its result was recorded. It was not run again, so it may or may "
        "not have taken effect. Check its effect before relying on it, and do not repeat it "
        "blindly."
    )


async def answer(parts: StepParts, batch: Batch) -> tuple[PendingApproval, ...]:
    """Answer every call of the batch, in request order; or, when some call waits for a
    person's decision, answer nothing and return the calls that wait."""
    parts.state.waiting = ()  # set again below if queued children are still open
    await hooks.before_tools(parts, batch)
    decisions.expire(parts, batch)
    decisions.apply(parts, batch)
    pending = ask_approvals(parts, batch)
    if pending:
        return pending
    state = parts.state
    for call in batch.open_calls():  # a denial covers identical calls of the batch too
        decision = state.decisions.get(call.id)
        if _denial(decision) and call.id not in batch.refused:
            state.denied.setdefault(call.key, decision)  # type: ignore[arg-type]
    results: dict[str, ToolResult] = dict(batch.answered)
    to_run: list[ToolCall] = []
    for call in batch.open_calls():
        decision = state.decisions.get(call.id)
        if decision is not None and decision.answer is not None and call.id not in batch.refused:
            results[call.id] = decisions.answered(parts, call, decision)  # nothing runs
            continue
        text = _refusal(parts, call, batch)
        if text is None:
            to_run.append(call)
            continue
        uncertain = call.id in batch.journaled  # dispatched before the crash: spent
        results[call.id] = _record(
            parts,
            ToolResult(
                call.id,
                call.name,
                call.key,
                text,
                is_error=True,
                size=len(text),
                digest=digest_text(text),
                uncertain=uncertain,
            ),
        )
    allowed = len(to_run)
    if parts.limits.max_tool_calls is not None:
        allowed = max(0, min(allowed, parts.limits.max_tool_calls - state.tool_calls))

    async def journal(call: ToolCall, tool: Tool) -> None:
        """Before a side effect: make the step so far durable, with an entry naming the call."""
        if tool.effect is not Effect.SIDE_EFFECTING:
            return
        parts.recorder.emit(
            ToolDispatched(step=state.step, call_id=call.id, call_key=call.key, name=call.name)
        )
        await parts.checkpoint()
        failpoint("after_journal")

    async def close_journal(item: ExecutedCall) -> None:
        """A side effect's result is saved at once: it closes the call's journal entry."""
        item = await hooks.after_tool(parts, item)
        results[item.call.id] = _record_executed(parts, item)
        await parts.checkpoint()

    run_batch = functools.partial(
        parts.executor.run_batch,
        to_run[:allowed],
        deadline=parts.clock.loop_deadline(),
        on_dispatch=journal,
        on_effect=close_journal,
    )
    paused: dict[str, tuple[PendingApproval, ...]] = {}
    waiting: dict[str, str] = {}  # children queued for the workers, not ended (ADR 0069)
    refused: set[str] = set()  # delegations that started no child: nothing spent
    if parts.executor.delegates:
        executed, paused, waiting, refused = await _with_children(
            parts, to_run[:allowed], run_batch
        )
    else:
        executed = await run_batch()
    for n, item in enumerate(executed):
        if item.call.id not in results and item.call.id not in paused.keys() | waiting.keys():
            executed[n] = item = await hooks.after_tool(parts, item)
            spent = item.call.id not in refused
            results[item.call.id] = _record_executed(parts, item, spent=spent)
    state.waiting = tuple(waiting.values())
    if paused or waiting:  # a child waits for a person or a worker: so does this run, its
        return _pause_for_children(parts, paused)  # other results kept
    for call in to_run[allowed:]:
        text = BUDGET_REFUSAL  # the ledger reads it in runs stored before `spent`
        results[call.id] = _record(
            parts, ToolResult(call.id, call.name, call.key, text, is_error=True, size=len(text))
        )
    for call in batch.calls:  # the model reads results in request order
        parts.context.append(results[call.id])
    _apply_evidence_resets(parts, [i for i in executed if i.call.id not in refused])
    state.hooked.clear()  # the batch is answered: what hooks decided on it is in its record
    state.ran_as.clear()
    failpoint("after_results")
    return ()


# -- approvals and refusals --------------------------------------------------------------------


async def _with_children(
    parts: StepParts,
    calls: list[ToolCall],
    run_batch: Callable[[], Awaitable[list[ExecutedCall]]],
) -> tuple[list[ExecutedCall], dict[str, tuple[PendingApproval, ...]], dict[str, str], set[str]]:
    """Run a batch whose tools may start child runs (keel/subagents.py): the calls children are
    named after made durable first, the run's side of its children (`_run/tree.py`) in reach
    of the delegation tools, and what the children spent folded in once the batch ends, in the
    step that records their answers. Also: the delegations whose child waits for a person, and
    those queued for the workers and not ended yet (ADR 0069), and those refused (no child
    started: they spend no tool call, SA-03)."""
    state = parts.state
    tree = Delegations(
        parts.recorder.run_id,
        parts.recorder.store,
        state,
        parts.limits,
        parts.clock,
        context_tokens=parts.context.total_tokens,
        listeners=parts.recorder.listeners,
        slots=asyncio.Semaphore(parts.limits.max_children),
        expected=sum(1 for c in calls if _delegates(parts, c)),
        tool_base=state.tool_calls,
        committed=len(calls),
    )
    if tree.expected:  # the calls children are named after: durable before any child starts
        await parts.checkpoint()
    mark = CURRENT.set(tree)
    try:
        executed = await run_batch()
    except asyncio.CancelledError:  # the run is cancelled: its children end before it does
        await tree.wait_children()
        raise
    finally:
        CURRENT.reset(mark)
    paused = tree.take_paused()
    tree.fold()
    return executed, paused, tree.waiting, tree.refused


def _delegates(parts: StepParts, call: ToolCall) -> bool:
    tool = parts.executor.get(call.name)
    return tool is not None and tool.delegates


def _pause_for_children(
    parts: StepParts, paused: dict[str, tuple[PendingApproval, ...]]
) -> tuple[PendingApproval, ...]:
    """The run waits for its children's pending calls, shown under qualified ids; deciding
    one decides it in the child (keel/approvals.py), and the resumed batch runs the waiting
    delegation again, which resumes the child."""
    return _now_pending(parts, tuple(p for calls in paused.values() for p in calls))


def _now_pending(
    parts: StepParts, waiting: tuple[PendingApproval, ...], *, own: bool = False
) -> tuple[PendingApproval, ...]:
    """The run's pending calls are `waiting`; each not asked about before is recorded, with
    its tool's parameters when the call is the run's `own` (a child's are in its record)."""
    state = parts.state
    asked = {p.call_id for p in state.pending}
    for p in waiting:
        if p.call_id not in asked:
            tool = parts.executor.get(p.name) if own else None
            parts.recorder.emit(
                ApprovalRequested(
                    step=state.step,
                    call_id=p.call_id,
                    name=p.name,
                    arguments=p.arguments,
                    call_key=p.call_key,
                    note=p.note,
                    parameters=None if tool is None else tool.parameters,
                    expires_at=p.expires_at,
                )
            )
    state.pending = waiting
    return waiting


def _denial(decision: Decision | None) -> bool:
    """A decision that says no: a denial (an answer in place of the tool is not one)."""
    return decision is not None and not decision.approved and decision.answer is None


def ask_approvals(parts: StepParts, batch: Batch) -> tuple[PendingApproval, ...]:
    """The calls that need a decision nobody has made yet. The breaker already ran. A call
    asked before (a resumed pause) keeps the expiry it was first given."""
    state = parts.state
    denied_here = {c.key for c in batch.calls if _denial(state.decisions.get(c.id))}
    earlier = {p.call_id: p for p in state.pending}
    timeout = parts.limits.approval_timeout
    expires = None if timeout is None else time.time() + timeout
    waiting = []
    for call in batch.open_calls():
        if call.id in state.decisions or call.key in state.denied or call.key in denied_here:
            continue
        if call.id in batch.journaled:
            continue
        tool = parts.executor.get(call.name)
        until = earlier[call.id].expires_at if call.id in earlier else expires
        note = _unknown_effect_note(parts, tool, call)
        if note is not None:  # asked twice after an unknown effect: a person decides
            waiting.append(
                PendingApproval(
                    call.id, call.name, call.arguments, call.key, note, expires_at=until
                )
            )
            continue
        try:
            if tool is not None and _needs_approval(parts, tool, call):
                waiting.append(
                    PendingApproval(call.id, call.name, call.arguments, call.key, expires_at=until)
                )
        except ToolError as error:  # the user's approval predicate failed: never run it
            batch.refused[call.id] = f"Error: {error} The call was not run."
    return _now_pending(parts, tuple(waiting), own=True)


def _unknown_effect_note(parts: StepParts, tool: Tool | None, call: ToolCall) -> str | None:
    """Why this call needs a person although its tool may be pre-approved: an identical
    side-effecting call earlier in the run ended "effect unknown", so running it again could
    do the thing twice (ADR 0033). None when nothing like that happened."""
    first = parts.state.unknown_effects.get(call.key)
    if first is None or first == call.id or tool is None:
        return None
    if tool.effect is not Effect.SIDE_EFFECTING:
        return None
    return (
        f"the identical call {first} ended with its effect unknown (it timed out, crashed or "
        "was cancelled while running), so it may have happened already; approve only if "
        "doing it again is what you want"
    )


def _needs_approval(parts: StepParts, tool: Tool, call: ToolCall) -> bool:
    if tool.name in parts.approve_tools or not isinstance(call.arguments, dict):
        return False
    if tool.name in parts.state.approved_for_run:  # a person approved it for this run
        return False
    return tool.needs_approval(call.arguments)


def _refusal(parts: StepParts, call: ToolCall, batch: Batch) -> str | None:
    """The text answering a call that must not run, or None when it may run."""
    state = parts.state
    if call.id in batch.refused:  # a decision for another call, or a failed predicate
        return batch.refused[call.id]
    decision = state.decisions.get(call.id)
    if decision is not None and not decision.approved:
        return denial_text(call, decision.by, decision.reason, again=False)
    if decision is None and call.key in state.denied:
        denial = state.denied[call.key]
        return denial_text(call, denial.by, denial.reason, again=True)
    if call.id in batch.journaled:
        return uncertain_text(call)
    return None


# -- recording ---------------------------------------------------------------------------------


def _record_executed(parts: StepParts, executed: ExecutedCall, *, spent: bool = True) -> ToolResult:
    """A call the executor answered: it counts against the tool-call budget, unless it was a
    delegation refused before any child started (`spent` False)."""
    result = executed.result
    if executed.full_content is not None:
        parts.recorder.whole_text(result.digest, executed.full_content)
    return _record(parts, result, executed.duration_ms, spent=spent)


def _record(
    parts: StepParts, result: ToolResult, duration_ms: float = 0.0, *, spent: bool = False
) -> ToolResult:
    """`spent`: the call counts against the tool-call budget (keel.ledger folds it, and a
    result left unknown, when the event is recorded)."""
    parts.recorder.tool_result(result, duration_ms, spent=spent or result.uncertain)
    return result


def _apply_evidence_resets(parts: StepParts, executed: list[ExecutedCall]) -> None:
    """Each result that came back, in request order: the breaker's policy decides whether it
    restarts its key's counter (a changed observation; under `progress`, any changed result)
    and whether a side effect moved the world."""
    breaker = parts.breaker
    for item in executed:
        tool = parts.executor.get(item.call.name)
        if tool is None:
            continue
        result, side_effect = item.result, tool.effect is Effect.SIDE_EFFECTING
        if not result.is_error:
            restart = breaker.settle(
                item.call.key,
                result.digest,
                observation=tool.effect is Effect.OBSERVATION,
                side_effect=side_effect,
            )
            if restart is not None:
                parts.recorder.restarted(restart)
        breaker.answered(  # the repeat tiers (docs/adr/0050)
            item.call.key,
            item.call.name,
            result.digest,
            error=result.is_error,
            empty=says_nothing(result.content),
            side_effect=side_effect,
        )
