"""The four decisions on a paused call (ADR 0052): approve with edited arguments, answer
instead, approve for the rest of the run, and expiry; each bound to the exact pending call."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

import keel
from keel import approvals
from keel.records import (
    ApprovalDecided,
    ApprovalRequested,
    Decision,
    ToolDispatched,
    ToolResultRecorded,
)
from keel.store import RunStore

SENT: list[str] = []


@keel.tool(effect="side_effecting", requires_approval=True)
def publish(text: str, copies: int = 1) -> str:
    """Publish text."""
    SENT.append(f"{text} x{copies}")
    return f"published {text!r} x{copies}"


@keel.tool(effect="side_effecting", requires_approval=True)
def page(who: str) -> str:
    """Page someone."""
    return f"paged {who}"


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


def agent(turns: list[dict[str, Any]], store: RunStore, **limits: Any) -> keel.Agent:
    transport = keel.ScriptedTransport.from_dict({"turns": turns}, record=True)
    return keel.Agent(transport, tools=[publish, page], store=store, limits=keel.Limits(**limits))


def of_type(store: RunStore, run_id: str, kind: type[Any]) -> list[Any]:
    return [e for e in store.events(run_id) if isinstance(e, kind)]


@pytest.fixture(autouse=True)
def _sent() -> None:
    SENT.clear()


@pytest.fixture
def store(tmp_path: Path) -> keel.Store:
    return keel.Store(tmp_path / "runs.sqlite")


def test_edited_arguments_are_validated_against_the_tools_schema(store: keel.Store) -> None:
    a = agent([call("publish", text="draft"), {"text": "done"}], store)
    paused = a.run("q")
    (pending,) = paused.pending_approvals
    for wrong in ({"copies": 2}, {"text": "x", "copies": "many"}, ["not", "an", "object"]):
        with pytest.raises(keel.ConfigError, match="edited arguments"):
            a.approve(paused.run_id, pending.call_id, arguments=wrong)  # type: ignore[arg-type]
    # the command line's check: the schema recorded with the call, without the tool
    with pytest.raises(keel.ConfigError, match="schema"):
        approvals.approve(store, paused.run_id, pending.call_id, arguments={"copies": 2})
    record = store.get_run(paused.run_id)
    assert record is not None and record.state.decisions == {}
    assert not of_type(store, paused.run_id, ApprovalDecided)


def test_edited_arguments_are_recorded_beside_the_original_and_are_what_runs(
    store: keel.Store,
) -> None:
    a = agent([call("publish", text="draft"), {"text": "done"}], store)
    paused = a.run("q")
    (pending,) = paused.pending_approvals
    a.approve(paused.run_id, pending.call_id, arguments={"text": "final", "copies": 2}, by="ana")
    done = a.resume(paused.run_id)
    assert done.status == "completed"
    assert SENT == ["final x2"]  # what the tool received
    (asked,) = of_type(store, paused.run_id, ApprovalRequested)
    (decided,) = of_type(store, paused.run_id, ApprovalDecided)
    assert asked.arguments == {"text": "draft"}  # the original, as the model wrote it
    assert decided.arguments == {"text": "final", "copies": 2} and decided.by == "ana"
    assert decided.call_key == 'publish {"text":"draft"}'  # bound to the call it was given for
    (result,) = of_type(store, paused.run_id, ToolResultRecorded)
    edited_key = 'publish {"copies":2,"text":"final"}'
    assert result.call_key == edited_key
    (journal,) = of_type(store, paused.run_id, ToolDispatched)
    assert journal.call_key == edited_key


def test_the_loop_counters_count_the_key_of_what_ran(store: keel.Store) -> None:
    a = agent([call("publish", text="draft"), {"text": "done"}], store)
    paused = a.run("q")
    (pending,) = paused.pending_approvals
    a.approve(paused.run_id, pending.call_id, arguments={"text": "final"})
    a.resume(paused.run_id)
    counts = {k: c.count for k, c in store.counters(paused.run_id).items()}
    assert counts.get('publish {"text":"draft"}', 0) == 0
    assert counts['publish {"text":"final"}'] == 1


def test_an_answer_instead_is_the_calls_result_and_nothing_runs(store: keel.Store) -> None:
    a = agent([call("page", who="oncall"), {"text": "done"}], store)
    paused = a.run("q")
    (pending,) = paused.pending_approvals
    a.answer(paused.run_id, pending.call_id, "I paged them myself; they are on it.", by="bo")
    done = a.resume(paused.run_id)
    assert done.status == "completed" and done.tool_calls == 0
    assert not of_type(store, paused.run_id, ToolDispatched)
    (result,) = of_type(store, paused.run_id, ToolResultRecorded)
    assert result.content == "I paged them myself; they are on it."
    assert result.answered_by == "bo" and not result.is_error
    (decided,) = of_type(store, paused.run_id, ApprovalDecided)
    assert decided.answer == result.content and decided.by == "bo"
    # the model read the person's text as the call's result
    transport = a.transport
    assert isinstance(transport, keel.ScriptedTransport)
    last = transport.requests[-1].items[-1]
    assert isinstance(last, keel.ToolResult) and last.content == f"[r1] {result.content}"
    with pytest.raises(keel.AlreadyDecided):
        a.approve(paused.run_id, pending.call_id)


def test_approve_for_run_is_a_recorded_rule_kept_across_a_resume(store: keel.Store) -> None:
    turns = [
        call("publish", text="one"),
        {
            "tool_calls": [
                {"name": "publish", "arguments": {"text": "two"}},
                {"name": "page", "arguments": {"who": "ana"}},
            ]
        },
        call("publish", text="three"),
        {"text": "done"},
    ]
    a = agent(turns, store)
    paused = a.run("q")
    (first,) = paused.pending_approvals
    a.approve(paused.run_id, first.call_id, for_run=True, by="ana")
    again = a.resume(paused.run_id)  # publish two needs nobody; page still does
    assert again.status == "awaiting_approval"
    assert [p.name for p in again.pending_approvals] == ["page"]
    record = store.get_run(paused.run_id)
    assert record is not None and set(record.state.approved_for_run) == {"publish"}
    assert record.state.approved_for_run["publish"].by == "ana"
    a.approve(again.run_id, again.pending_approvals[0].call_id)
    other = agent(turns, store)  # another process: the rule comes from the store
    other.transport.restore(record.state.transport)  # type: ignore[attr-defined]
    done = other.resume(paused.run_id)
    assert done.status == "completed"
    assert SENT == ["one x1", "two x1", "three x1"]


def test_approve_for_run_never_carries_to_another_run(store: keel.Store) -> None:
    a = agent([call("publish", text="one"), {"text": "done"}], store)
    paused = a.run("q")
    a.approve(paused.run_id, paused.pending_approvals[0].call_id, for_run=True)
    a.resume(paused.run_id)
    b = agent([call("publish", text="one"), {"text": "done"}], store)
    fresh = b.run("q")
    assert fresh.status == "awaiting_approval"


def test_expiry_is_a_denial_and_the_run_goes_on(store: keel.Store) -> None:
    a = agent([call("publish", text="x"), {"text": "done without it"}], store,
              approval_timeout=0.05)  # fmt: skip
    paused = a.run("q")
    (pending,) = paused.pending_approvals
    assert pending.expires_at is not None and pending.expires_at > time.time() - 1
    (asked,) = of_type(store, paused.run_id, ApprovalRequested)
    assert asked.expires_at == pending.expires_at
    time.sleep(0.1)
    done = a.resume(paused.run_id)
    assert (done.status, done.answer) == ("completed", "done without it")
    assert SENT == []
    (decided,) = of_type(store, paused.run_id, ApprovalDecided)
    assert decided.expired and not decided.approved and decided.by == "approval timeout"
    (result,) = of_type(store, paused.run_id, ToolResultRecorded)
    assert result.is_error and "approval timeout" in result.content


def test_a_resumed_pause_keeps_its_first_expiry(store: keel.Store) -> None:
    a = agent([call("publish", text="x"), {"text": "done"}], store, approval_timeout=60)
    paused = a.run("q")
    first = paused.pending_approvals[0].expires_at
    again = a.resume(paused.run_id)  # nobody decided: still waiting, same deadline
    assert again.status == "awaiting_approval"
    assert again.pending_approvals[0].expires_at == first


def test_expiry_is_a_denial_also_when_the_approver_arrives_after_it(store: keel.Store) -> None:
    a = agent([call("publish", text="x"), {"text": "done without it"}], store,
              approval_timeout=0.05)  # fmt: skip
    paused = a.run("q")
    (pending,) = paused.pending_approvals
    time.sleep(0.1)
    with pytest.raises(keel.DecisionExpired, match="approval timeout"):
        a.approve(paused.run_id, pending.call_id, by="late")
    record = store.get_run(paused.run_id)
    assert record is not None
    decision = record.state.decisions[pending.call_id]
    assert decision.expired and not decision.approved
    with pytest.raises(keel.AlreadyDecided):  # final, as any decision
        a.deny(paused.run_id, pending.call_id, reason="no")
    done = a.resume(paused.run_id)
    assert done.status == "completed" and SENT == []


def test_a_decision_for_other_arguments_is_refused(store: keel.Store) -> None:
    a = agent([call("publish", text="draft"), {"text": "done"}], store)
    paused = a.run("q")
    (pending,) = paused.pending_approvals
    seen = keel.ToolCall.from_arguments("x", "publish", {"text": "something else"}).key
    with pytest.raises(keel.ConfigError, match="nothing was recorded"):
        approvals.decide(
            store, paused.run_id, pending.call_id, Decision(True, "ana"), expect_key=seen
        )
    record = store.get_run(paused.run_id)
    assert record is not None and record.state.decisions == {}
    approvals.decide(
        store, paused.run_id, pending.call_id, Decision(True, "ana"), expect_key=pending.call_key
    )
    assert a.resume(paused.run_id).status == "completed" and SENT == ["draft x1"]


def test_a_stored_decision_bound_to_another_call_is_refused_on_resume(
    store: keel.Store, tmp_path: Path
) -> None:
    """A decision whose recorded call does not match the open call of that id (written by
    hand, or by a version that bound it differently) never runs the call."""
    a = agent([call("publish", text="draft"), {"text": "done"}], store)
    paused = a.run("q")
    (pending,) = paused.pending_approvals
    a.approve(paused.run_id, pending.call_id)
    store.close()
    import sqlite3

    db = sqlite3.connect(tmp_path / "runs.sqlite")
    (state,) = db.execute("SELECT state FROM runs").fetchone()
    data = json.loads(state)
    data["decisions"][pending.call_id]["call_key"] = 'publish {"text":"other"}'
    db.execute("UPDATE runs SET state = ?", (json.dumps(data),))
    db.commit()
    db.close()
    reopened = keel.Store(tmp_path / "runs.sqlite")
    b = agent([call("publish", text="draft"), {"text": "done"}], reopened)
    b.transport.restore(data["transport"])  # type: ignore[attr-defined]
    done = b.resume(paused.run_id)
    assert done.status == "completed" and SENT == []
    (result,) = of_type(reopened, paused.run_id, ToolResultRecorded)
    assert result.is_error and "given for another call" in result.content


def test_an_edited_approval_of_a_childs_call_goes_through_its_parent(tmp_path: Path) -> None:
    child_turns = [call("publish", text="draft"), {"text": "child done"}]
    child = keel.Agent(
        keel.ScriptedTransport.from_dict({"turns": child_turns}), tools=[publish, page]
    )
    parent = keel.Agent(
        keel.ScriptedTransport.from_dict(
            {"turns": [call("writer", task="publish it"), {"text": "parent done"}]}
        ),
        tools=[child.as_tool("writer", "Publishes")],
        store=tmp_path / "runs.sqlite",
    )
    with parent:
        paused = parent.run("q")
        (pending,) = paused.pending_approvals
        assert pending.run_id is not None
        with pytest.raises(keel.ConfigError, match="schema"):
            parent.approve(paused.run_id, pending.call_id, arguments={"copies": 3})
        parent.approve(paused.run_id, pending.call_id, arguments={"text": "final"}, by="ana")
        inner = parent.store.get_run(pending.run_id)
        assert inner is not None
        decided = next(iter(inner.state.decisions.values()))
        assert decided.arguments == {"text": "final"} and decided.by == "ana"
        done = parent.resume(paused.run_id)
        assert (done.status, done.answer) == ("completed", "parent done")
        assert SENT == ["final x1"]
