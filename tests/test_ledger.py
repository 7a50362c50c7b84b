"""The ledger (keel/ledger.py): every event kind is handled or declared inert, and a fork's
derived state equals its original's field for field on scripted runs with tools, approvals,
children, refusals and elisions."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import keel
from keel import ledger, records
from keel._run.fork import derive
from keel.tools.base import Effect, make_tool
from keel.transports.scripted import ScriptedTransport
from support import call


def event_kinds() -> set[type[Any]]:
    return {
        kind
        for _, kind in inspect.getmembers(records, inspect.isclass)
        if issubclass(kind, records._EventBase) and kind is not records._EventBase
    }


def unlisted(kinds: set[type[Any]]) -> set[type[Any]]:
    """Event kinds the ledger neither handles nor declares inert."""
    return {k for k in kinds if k not in ledger.HANDLED and k not in ledger.INERT}


def test_every_event_kind_is_handled_by_the_ledger_or_declared_inert() -> None:
    kinds = event_kinds()
    assert len(kinds) >= 20
    assert unlisted(kinds) == set()
    assert set(ledger.HANDLED) & ledger.INERT == set()
    assert set(ledger.HANDLED) | ledger.INERT == kinds  # nothing listed that is not a kind


def test_a_new_event_kind_without_a_ledger_entry_is_reported() -> None:
    @dataclasses.dataclass(slots=True, kw_only=True)
    class BudgetTopped(records._EventBase):
        type = "budget_topped"
        tokens: int = 0

    assert unlisted({*event_kinds(), BudgetTopped}) == {BudgetTopped}


def test_the_ledger_folds_a_response_once_with_the_loop_timing() -> None:
    state = records.RunState()
    ledger.apply(
        state,
        records.ModelRequestSent(
            attempt=1, tool_choice=None, synthesis=None, items=1, estimated_input_tokens=10
        ),
    )
    response = records.ModelResponseReceived(
        text="hi", usage=keel.Usage(input_tokens=7, output_tokens=3), cost=0.5, took=2.25
    )
    ledger.apply(state, response)
    assert (state.model_calls, state.usage.total, state.cost) == (1, 10, 0.5)
    assert (state.costliest_call, state.longest_model_call) == (0.5, 2.25)


# -- the fork's state equals the original's ------------------------------------------------

LOOKS = ("leases", "checkpoints", "forks")
COMPARED = (
    "model_calls",
    "tool_calls",
    "usage",
    "cost",
    "costliest_call",
    "longest_model_call",
    "output_retries",
    "evidence_retries",
    "unknown_effects",
    "decisions",
    "denied",
    "children",
)


def _tools() -> list[keel.Tool]:
    def look(topic: str) -> str:
        """Look a topic up."""
        return f"about {topic}: " + "detail " * 120  # large enough to be elided later

    def note(text: str) -> str:
        """Write a note down."""
        return f"noted {text}"

    return [make_tool(look), make_tool(note, effect=Effect.SIDE_EFFECTING, requires_approval=True)]


def _turn(move: str) -> dict[str, Any]:
    kind, _, arg = move.partition(":")
    if kind == "look":
        return call("look", topic=arg)
    if kind == "two":
        return {"tool_calls": [{"name": "look", "arguments": {"topic": t}} for t in LOOKS[:2]]}
    if kind == "note":
        return call("note", text=arg)
    return call("helper", task=f"look up {arg}")


moves = st.lists(
    st.sampled_from([f"look:{t}" for t in LOOKS] + ["two:", "note:a", "note:b", "child:leases"]),
    min_size=1,
    max_size=7,
)


async def _run_to_the_end(
    store: keel.Store, turns: list[str], approvals: list[bool], max_tool_calls: int
) -> keel.RunResult:
    child = keel.Agent(
        ScriptedTransport.from_dict(
            {"turns": [call("look", topic="leases"), {"text": "leases expire"}] * 10}
        ),
        tools=_tools(),
    )
    parent = keel.Agent(
        ScriptedTransport.from_dict(
            {
                "turns": [_turn(m) for m in turns] + [{"text": "The answer."}],
                "on_synthesis": {"text": "Synthesized."},
            }
        ),
        tools=[*_tools(), child.as_tool("helper", "Looks things up")],
        store=store,
        limits=keel.Limits(
            context_tokens=600,
            max_tool_calls=max_tool_calls,
            max_model_calls=30,
            retry_base_delay=0.001,
        ),
    )
    result = await parent.arun("How do leases work?")
    decisions = iter(approvals)
    while result.pending_approvals:
        for pending in result.pending_approvals:
            if next(decisions, True):
                parent.approve(result.run_id, pending.call_id, by="ann")
            else:
                parent.deny(result.run_id, pending.call_id, reason="no notes", by="bob")
        result = await parent.aresume(result.run_id)
    return result


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(turns=moves, approvals=st.lists(st.booleans(), max_size=4), cap=st.sampled_from([2, 4, 50]))
def test_a_forks_derived_state_equals_the_originals_field_for_field(
    tmp_path: Path, turns: list[str], approvals: list[bool], cap: int
) -> None:
    store = keel.Store(tmp_path / f"runs-{abs(hash((tuple(turns), tuple(approvals), cap)))}.db")
    try:
        result = asyncio.run(_run_to_the_end(store, turns, approvals, cap))
        record = store.get_run(result.run_id)
        assert record is not None and record.status == "completed"
        events = store.events(result.run_id)
        prefix = derive(
            record.question,
            events,
            record.config.limits,
            record.state.step,
            {"run_id": result.run_id, "step": record.state.step},
            children=record.state.children,
        )
        for name in COMPARED:
            assert getattr(prefix.state, name) == getattr(record.state, name), name
        assert prefix.counters == store.counters(result.run_id)
        assert {c for c, _ in prefix.elisions} == store.elided(result.run_id)
    finally:
        store.close()
