"""Sub-agents: an `Agent` offered to another as a tool, each call a child run (ADR 0046).

    reader = Agent(model, tools=[...], limits=Limits(max_model_calls=8))
    lead = Agent(model, tools=[reader.as_tool("reader", "Reads one module and reports")])

A delegation is a tool call of the parent whose one argument is the task. It starts a run of
its own, in the parent's store, named after the parent's run and call (`child_run_id`), so the
call can be dispatched again without doing the work twice:

    no run of that name yet      start it, its limits carved from the parent's (_run/tree.py)
    ended (completed, failed)    its answer is read from the store: nothing runs again
    anything else                resume it where it stopped (a crash, an interruption, a pause)

That makes a delegation safe to re-run, so it is a read-only tool to its parent: delegations
of one batch run at once (at most `Limits.max_children`), and a parent resumed after a crash
runs the open ones again, which finishes each child from its last saved step. A child's own
side effects are journaled in the child, by the rules every run keeps.

A child always answers its parent: its answer (a synthesized one marked partial, with the limit
it reached), or an error naming its failure's kind. A child that waits for a person's decision
pauses its parent; the decision is taken on the parent (keel/approvals.py routes it) and the
parent's resume resumes the child.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Awaitable, Sequence
from typing import Protocol

import pydantic

from keel._run import (
    CHILD_QUEUE,
    CURRENT,
    Child,
    ChildQueue,
    Delegations,
    Opening,
    Resumed,
    qualified,
)
from keel.errors import LeaseHeld, ToolError
from keel.events import TreeListener
from keel.limits import Limits
from keel.records import Lineage
from keel.result import OVER, TERMINAL, ChildRun, RunResult
from keel.store import RunStore
from keel.tools.base import CURRENT_CALL, Effect, Tool

__all__ = [
    "AS_AGENT",
    "CHILD_TIMEOUT",
    "ChildAgent",
    "child_run_id",
    "delegation_tool",
    "result_text",
]

CHILD_TIMEOUT = 7 * 24 * 3600.0
"""A delegation's own timeout: none to speak of. The child's carved deadline (and the parent's,
which the executor applies to every call) is what bounds it."""
LEASE_WAIT = 120.0
"""Seconds a resumed parent waits for a child's lease held by a process that died."""
LEASE_POLL = 0.5
AS_AGENT = "as_agent"
"""The setting that names a child's `[agents.NAME]` table in its saved settings: a worker
rebuilds the child from its own record by it (keel/assemble.py)."""
WAITING_TEXT = "(waiting for the child run: a worker runs it)"


class ChildAgent(Protocol):
    """What a delegation needs of the agent it runs (`keel.Agent` is one)."""

    @property
    def limits(self) -> Limits: ...

    async def arun(self, question: str) -> RunResult: ...

    def launch(
        self, opening: Opening, *, listeners: Sequence[TreeListener] = ()
    ) -> Awaitable[RunResult]: ...


class Delegation(pydantic.BaseModel):
    task: str = pydantic.Field(
        description="The task for the child agent, in full: it sees nothing of this "
        "conversation but this text."
    )


def child_run_id(parent_run: str, call_id: str) -> str:
    """The child's run id: the same for the same parent call, so a delegation dispatched again
    (after a crash, on resume) finds the child it started."""
    digest = hashlib.sha256(f"{parent_run}\n{call_id}".encode()).hexdigest()
    return "run_" + digest[:16]


def delegation_tool(agent: ChildAgent, name: str, description: str) -> Tool:
    """`agent` as a tool named `name`: each call runs it on the call's task (`Agent.as_tool`)."""

    async def delegate(task: str) -> str:
        return await _delegate(agent, name, task)

    return Tool(
        name=name,
        description=description,
        args_model=Delegation,
        fn=delegate,
        effect=Effect.READ_ONLY,
        timeout=CHILD_TIMEOUT,
        delegates=True,
        source=f"the sub-agent {name!r}",
    )


async def _delegate(agent: ChildAgent, name: str, task: str) -> str:
    tree, call = CURRENT.get(), CURRENT_CALL.get()
    if tree is None or call is None:  # called outside a Keel run: a run of its own
        return result_text(name, await agent.arun(task))
    if not task.strip():
        raise ToolError(f"Error: {name} needs a task: say what the child agent should do.")
    child_id = child_run_id(tree.run_id, call.id)
    store = tree.store
    heard = tuple(h.for_child(child_id) for h in tree.listeners if isinstance(h, TreeListener))
    queue = CHILD_QUEUE.get()
    if queue is not None and store is not None and _rebuildable(agent):
        return await _queued(tree, call.id, agent, name, task, child_id, queue)
    async with tree.slots:
        record = None if store is None else store.get_run(child_id)
        if record is not None:
            tree.found(call.id)
        if record is not None and record.status in OVER:  # answered before: read, not rerun
            result = record.state.result(child_id, record.conversation_id)
        elif record is None:
            carved = tree.carve(call.id, agent.limits)
            if isinstance(carved, str):
                raise ToolError(f"Error: {name} was not started: {carved}.")
            child = Child(task, child_id, tree.run_id, call.id, name, carved, store)
            result = await _held(tree, call.id, agent.launch(child, listeners=heard))
        else:  # running (its process died), cancelled or paused: on from its last step
            tree.hold(call.id, record.config.limits)
            result = await _held(tree, call.id, _resumed(agent, child_id, store, heard))
    if result.status == "awaiting_approval":
        tree.paused[call.id] = tuple(qualified(child_id, p) for p in result.pending_approvals)
        return "(waiting for a decision in the child run)"
    tree.settle(call.id, _summary(child_id, call.id, name, result, store))
    return result_text(name, result)


def _rebuildable(agent: ChildAgent) -> bool:
    """A worker can rebuild the child from its own record: its agent was built from saved
    settings (`keel.assemble`), which name the `[agents.NAME]` table it came from."""
    config = getattr(agent, "config", None)
    return callable(config) and AS_AGENT in config().settings


async def _queued(
    tree: Delegations,
    call_id: str,
    agent: ChildAgent,
    name: str,
    task: str,
    child_id: str,
    queue: ChildQueue,
) -> str:
    """The child as a run of its own in the workers' queue (ADR 0069): recorded with its carved
    limits (the reservation its parent holds for it until it ends) and handed on; the parent
    pauses `awaiting_children` and holds no worker. Dispatched again (the parent queued again
    by its last child's end), it reads the child's answer, or waits for it again."""
    store = tree.store
    assert store is not None
    record = await asyncio.to_thread(store.get_run, child_id)
    if record is None:
        carved = tree.carve(call_id, agent.limits)
        if isinstance(carved, str):
            raise ToolError(f"Error: {name} was not started: {carved}.")
        lineage = Lineage(parent_run=tree.run_id, parent_call=call_id, agent=name)
        config = agent.config(carved).with_lineage(lineage)  # type: ignore[attr-defined]
        try:
            await asyncio.to_thread(queue.enqueue_child, child_id, task, config)
        except BaseException:
            tree.release(call_id)
            raise
        tree.waiting[call_id] = child_id
        return WAITING_TEXT
    tree.found(call_id)
    if record.status in TERMINAL:  # its answer, its spend folded in; a cancelled child is
        result = record.state.result(child_id, record.conversation_id)  # not taken up again
        tree.settle(call_id, _summary(child_id, call_id, name, result, store))
        return result_text(name, result)
    tree.hold(call_id, record.config.limits)  # its reservation, held until it ends
    undecided = [p for p in record.state.pending if p.call_id not in record.state.decisions]
    if record.status == "awaiting_approval" and undecided:
        tree.paused[call_id] = tuple(qualified(child_id, p) for p in record.state.pending)
        return "(waiting for a decision in the child run)"
    if record.status == "awaiting_approval":  # every call decided: on it goes
        await asyncio.to_thread(queue.hand_on_decided, child_id)
    tree.waiting[call_id] = child_id
    return WAITING_TEXT


async def _held(tree: Delegations, call_id: str, child: Awaitable[RunResult]) -> RunResult:
    """The child's result; its carve-out given back if it never gets one (cancelled with the
    parent, which resumes it on its own resume)."""
    try:
        return await _cancelled_with_parent(tree, child)
    except BaseException:
        tree.release(call_id)
        raise


async def _cancelled_with_parent(
    tree: Delegations | None, child: Awaitable[RunResult]
) -> RunResult:
    """The child's result. When the parent is cancelled meanwhile (`keel cancel`, SIGTERM, the
    library), the child is cancelled as a run is (`RunHandle.cancel`): it stops its in-flight
    calls and records `cancelled` before the parent goes on cancelling, instead of being torn
    down with its task and left `running` (SA-10)."""
    running = asyncio.ensure_future(child)
    if tree is not None:  # the batch waits for it if the parent is cancelled
        tree.running.add(running)
        running.add_done_callback(tree.running.discard)
    try:
        return await asyncio.shield(running)
    except asyncio.CancelledError:
        cancel = getattr(child, "cancel", None)
        if callable(cancel):
            cancel()
        else:  # a resume that may still be waiting out a lease: it cancels its own handle
            running.cancel()
        with contextlib.suppress(Exception, asyncio.CancelledError):  # its ending, first
            await asyncio.shield(running)
        raise


async def _resumed(
    agent: ChildAgent, child_id: str, store: RunStore | None, heard: tuple[TreeListener, ...]
) -> RunResult:
    """Resume a child, waiting out the lease of a process that died while advancing it (on
    another machine its lease must expire; here a dead holder is seen at once)."""
    waited = 0.0
    while True:
        try:
            handle = agent.launch(Resumed(child_id, store), listeners=heard)
            return await _cancelled_with_parent(None, handle)
        except LeaseHeld:  # raised as the run opens, in its task
            if waited >= LEASE_WAIT:
                raise
            await asyncio.sleep(LEASE_POLL)
            waited += LEASE_POLL


def _summary(
    run_id: str, call_id: str, name: str, result: RunResult, store: RunStore | None
) -> ChildRun:
    record = None if store is None else store.get_run(run_id)
    return ChildRun(
        run_id=run_id,
        call_id=call_id,
        agent=name,
        status=result.status,
        synthesized=result.synthesized,
        model_calls=result.model_calls,
        tool_calls=result.tool_calls,
        usage=result.usage,
        cost=result.cost,
        delegations=0 if record is None else record.state.delegations,
    )


def result_text(name: str, result: RunResult) -> str:
    """What the parent reads of its child's run: the answer, marked partial when the child
    stopped at a limit; a failure, as an error naming its kind (raised as ToolError, so the
    parent's result is an error result)."""
    where = f"child agent {name} (run {result.run_id})"
    if result.status == "completed":
        answer = result.answer or ""
        if result.synthesized is None and not result.cut_off:
            return answer
        why = (
            "its answer was cut off at the model's output limit"
            if result.synthesized is None
            else f"it reached its {result.synthesized} limit and wrote the best answer its "
            "evidence supports"
        )
        gaps = f"; gaps: {'; '.join(result.gaps)}" if result.gaps else ""
        return f"[partial answer from {where}: {why}{gaps}]\n{answer}"
    if result.failure is not None:
        raise ToolError(f"Error: {where} failed: {result.failure.kind}: {result.failure.message}")
    raise ToolError(f"Error: {where} ended {result.status} without an answer.")
