"""A run's children (sub-agents, ADR 0046): what a delegation tool may spend, and what its
parent takes back when the batch ends.

A running loop puts its `Delegations` in a context variable; the delegation tools it dispatches
(`keel/subagents.py`) find it there. Each child is carved its limits from what the parent has
left, less a reserve for the parent's own final answer, and while children run their carve-outs
are held apart, so children running at once can never spend more together than the parent had:

    left     = the parent's limit - what it spent - what running children hold
    carved   = min(the child's own limit, left - the parent's reserve)

When the batch ends, the parent folds what each child spent into its own counters, usage and
cost (in the same step, so the checkpoint that records the child's answer records its spend),
and the calls whose child paused for a person pause the parent.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from keel import ledger
from keel._run.budgets import Clock, deadline_reserve
from keel.limits import Limits
from keel.records import RunState
from keel.result import ChildRun, PendingApproval
from keel.store import RunStore

__all__ = ["CURRENT", "PARENT_RESERVE_CALLS", "Delegations", "qualified"]

CHILD_STOP = 30.0
"""Seconds a cancelled parent waits for its cancelled children to record their endings."""

PARENT_RESERVE_CALLS = 1
"""Model calls a parent keeps for its own synthesis turn: children never get them."""


@dataclass(frozen=True, slots=True)
class _Held:
    """What a running child may spend at most: held apart from the parent's budget."""

    model_calls: int
    tool_calls: int
    tokens: int
    cost: float
    delegations: int = 0
    """The child itself (1) and the children its own tree may start."""


@dataclass(slots=True)
class Delegations:
    """The parent's side of its children, shared with the delegation tools of its batches."""

    run_id: str
    store: RunStore | None
    state: RunState
    """The parent's live state: what it has spent so far."""
    limits: Limits
    clock: Clock
    context_tokens: int = 0
    """The parent's context size now: its synthesis turn is at least that big."""
    listeners: tuple[Callable[[Any], None], ...] = ()
    """The parent's listeners: those that hear a tree (`keel.events.TreeListener`) hear its
    children too."""
    slots: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(4))
    """Children running at once (`Limits.max_children`)."""
    expected: int = 0
    """Delegations in the batch: what is left is shared equally among those yet to start."""
    started: int = 0
    tool_base: int = 0
    """The parent's tool calls before this batch."""
    committed: int = 0
    """Tool calls of the parent this batch spends: every call it runs, delegations included,
    less the delegations refused (a refused one runs nothing and spends nothing, SA-03)."""
    held: dict[str, _Held] = field(default_factory=dict)
    answered: dict[str, ChildRun] = field(default_factory=dict)
    """Children that ended in this batch, by the parent's call id: folded when it ends."""
    paused: dict[str, tuple[PendingApproval, ...]] = field(default_factory=dict)
    """Children that wait for a person, by the parent's call id: the parent pauses too."""
    waiting: dict[str, str] = field(default_factory=dict)
    """Children queued for the workers that have not ended, by the parent's call id: their
    run ids. The parent pauses `awaiting_children` (ADR 0069)."""
    refused: set[str] = field(default_factory=set)
    """Delegations answered with why no child was started: not a tool call spent."""
    running: set[asyncio.Future[Any]] = field(default_factory=set)
    """Children running now: a cancelled parent waits for each to record its ending."""

    async def wait_children(self) -> None:
        """The parent is being cancelled: wait (CHILD_STOP seconds at most) for its children,
        cancelled with it, to record that they ended, so none is left `running` behind an
        ended parent (SA-10). Its own cancellation is not stopped by it."""
        if self.running:
            await asyncio.wait(tuple(self.running), timeout=CHILD_STOP)

    def carve(self, call_id: str, declared: Limits) -> Limits | str:
        """The child's limits: its own, capped by what the parent has left less the parent's
        reserve; or why there is nothing left to give (the call is answered with it, and
        spends nothing)."""
        ways = max(1, self.expected - self.started)  # an equal share for each yet to start
        self.started += 1
        carved = self._carve(declared, ways)
        if isinstance(carved, str):
            self.refused.add(call_id)
            self.committed -= 1  # its tool call is left to its siblings and the parent
            return carved
        self.hold(call_id, carved)
        return carved

    def _carve(self, declared: Limits, ways: int) -> Limits | str:
        limits, state = self.limits, self.state
        held = list(self.held.values())
        capped: dict[str, object] = {}
        tree = _tree_caps(limits, state, held, declared, ways)
        if isinstance(tree, str):
            return tree
        capped.update(tree)
        calls = _left(limits.max_model_calls, state.model_calls, held, "model_calls")
        if calls is not None:
            calls -= PARENT_RESERVE_CALLS
            if calls < 1:
                return (
                    "the parent has no model calls left to give a child (it keeps one for its "
                    "own answer)"
                )
            capped["max_model_calls"] = _least(declared.max_model_calls, calls // ways)
        # every call of this batch spends one of the parent's tool calls: the delegations
        # yet to start included, so a child's share never takes a sibling's own call
        base = self.tool_base + self.committed
        tools = _left(limits.max_tool_calls, base, held, "tool_calls")
        if tools is not None:
            if tools < 1:
                return "the parent has no tool calls left to give a child"
            capped["max_tool_calls"] = _least(declared.max_tool_calls, max(1, tools // ways))
        tokens = _left(limits.max_tokens, state.usage.total, held, "tokens")
        if tokens is not None:
            tokens -= 2 * self.context_tokens  # the parent's last turn carries its context
            if tokens < 1:
                return "the parent has no tokens left to give a child"
            capped["max_tokens"] = _least(declared.max_tokens, max(1, tokens // ways))
        if limits.max_cost is not None:
            spent = (state.cost or 0.0) + sum(h.cost for h in held)
            cost = (limits.max_cost - spent - state.costliest_call) / ways
            if cost <= 0:
                return "the parent has no cost budget left to give a child"
            capped["max_cost"] = cost if declared.max_cost is None else min(declared.max_cost, cost)
        remaining = self.clock.remaining()
        if remaining is not None:
            remaining -= deadline_reserve(state, limits) or 0.0
            if remaining <= 0:
                return "the parent has no time left to give a child before its deadline"
            own = declared.deadline
            capped["deadline"] = remaining if own is None else min(own, remaining)
            capped["deadline_reserve"] = None if declared.deadline_reserve is None else min(
                declared.deadline_reserve, remaining / 2
            )  # fmt: skip
        return dataclasses.replace(declared, **capped)  # type: ignore[arg-type]

    def found(self, call_id: str) -> None:
        """A delegation whose child exists already (the batch dispatched again, after a crash
        or a wait for queued children): it has started, so the delegations yet to start share
        what is left without it (its carve-out is held, or its spend settled, apart)."""
        self.started += 1

    def hold(self, call_id: str, limits: Limits) -> None:
        """Hold a running child's limits apart from what other children may be given."""
        self.held[call_id] = _Held(
            limits.max_model_calls or 0,
            limits.max_tool_calls or 0,
            limits.max_tokens or 0,
            limits.max_cost or 0.0,
            1 + (limits.max_delegations or 0),
        )

    def settle(self, call_id: str, child: ChildRun) -> None:
        """The child ended: what it spent is held (instead of its limits) until the batch ends
        and `fold` adds it to the parent's counters."""
        self.held[call_id] = _Held(
            child.model_calls,
            child.tool_calls,
            child.usage.total,
            child.cost or 0.0,
            1 + child.delegations,
        )
        self.answered[call_id] = child

    def release(self, call_id: str) -> None:
        """The child could not start: give its carve-out back."""
        self.held.pop(call_id, None)

    def fold(self) -> None:
        """Add what this batch's children spent to the parent's own counters (once: the
        record of each child's answer and its spend are saved in the same step)."""
        for call_id, child in self.answered.items():
            if call_id not in self.paused:
                ledger.fold_child(self.state, call_id, child)
        self.answered.clear()
        if _past_a_budget(self.state, self.limits):  # a child overran its share after all
            self.state.answer_owed = True  # the parent still gets its one answering turn

    def take_paused(self) -> dict[str, tuple[PendingApproval, ...]]:
        paused, self.paused = self.paused, {}
        return paused


def qualified(child_run: str, pending: PendingApproval) -> PendingApproval:
    """A child's pending call as its parent shows it: ``CHILD_RUN:CALL_ID``, naming the child
    (a grandchild's id is qualified again, so a decision travels down the whole path)."""
    return dataclasses.replace(pending, call_id=f"{child_run}:{pending.call_id}", run_id=child_run)


def _tree_caps(
    limits: Limits, state: RunState, held: list[_Held], declared: Limits, ways: int
) -> dict[str, object] | str:
    """The tree's own caps for a child (ADR 0066): one level less to go below it, and a share
    of the delegations the tree has left; or why the parent may start no child."""
    if limits.max_depth < 1:
        return (
            "this run is at the tree's depth limit (max_depth), so it may not start a child "
            "run: do the task with your own tools, or answer with what you have"
        )
    capped: dict[str, object] = {"max_depth": min(declared.max_depth, limits.max_depth - 1)}
    if limits.max_delegations is not None:
        left = limits.max_delegations - state.delegations - sum(h.delegations for h in held)
        if left < 1:
            return (
                f"this part of the tree has started all {limits.max_delegations} child runs "
                "its max_delegations allows: do the task with your own tools, or answer with "
                "what you have"
            )
        share = max(0, left - ways) // ways  # each delegation yet to start needs its own one
        own = declared.max_delegations
        capped["max_delegations"] = share if own is None else min(own, share)
    return capped


def _past_a_budget(state: RunState, limits: Limits) -> bool:
    calls, tokens, cost = limits.max_model_calls, limits.max_tokens, limits.max_cost
    return (
        (calls is not None and state.model_calls >= calls)
        or (tokens is not None and state.usage.total >= tokens)
        or (cost is not None and (state.cost or 0.0) >= cost)
    )


def _left(limit: int | None, spent: int, held: list[_Held], what: str) -> int | None:
    if limit is None:
        return None
    return limit - spent - sum(int(getattr(h, what)) for h in held)


def _least(own: int | None, left: int) -> int:
    return left if own is None else min(own, left)


CURRENT: ContextVar[Delegations | None] = ContextVar("keel_delegations", default=None)
"""The run whose batch is running now, for the delegation tools it dispatches."""
