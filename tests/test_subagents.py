"""Sub-agents (keel/subagents.py, keel/_run/tree.py, ADR 0046): a child is a run of its own,
bounded by its parent, and it always answers its parent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keel import Agent, Limits, ScriptedTransport
from keel.records import ToolResultRecorded
from keel.result import RunResult
from keel.store import RunStore, Store
from keel.subagents import child_run_id
from keel.tools.files import file_tools
from keel.tools.writes import write_tools
from subagent_script import delegate, make_repo, read, script


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path)


def lead(
    children: list[Any], turns: list[dict[str, Any]], store: Path | RunStore, **limits: Any
) -> Agent:
    return Agent(
        ScriptedTransport.from_dict({"turns": turns, "on_synthesis": {"text": "lead: partial"}}),
        tools=children,
        store=store,
        limits=Limits(**limits),
    )


def tool_results(store: RunStore, run_id: str) -> dict[str, ToolResultRecorded]:
    return {e.call_id: e for e in store.events(run_id) if isinstance(e, ToolResultRecorded)}


def test_a_child_is_a_run_of_its_own_stored_with_its_parents_run_and_call(
    tmp_path: Path, repo: Path
) -> None:
    child_model = script(tmp_path, "child", {"turns": [{"tool_calls": [read()]}, {"text": "A."}]})
    reader = Agent(child_model, tools=file_tools(repo), limits=Limits(max_model_calls=5))
    parent = lead(
        [reader.as_tool("reader", "Reads files and reports")],
        [{"tool_calls": [delegate("reader", "What does a.md say?")]}, {"text": "It says A."}],
        tmp_path / "runs.sqlite",
    )
    with parent:
        result = parent.run("What does a.md say?")
        assert (result.status, result.answer) == ("completed", "It says A.")
        (child,) = result.children
        assert child.run_id == child_run_id(result.run_id, child.call_id)
        assert (child.agent, child.status, child.model_calls, child.tool_calls) == (
            "reader", "completed", 2, 1,
        )  # fmt: skip
        record = parent.store.get_run(child.run_id)
        assert record is not None and record.question == "What does a.md say?"
        assert (record.config.parent_run, record.config.parent_call) == (
            result.run_id,
            child.call_id,
        )
        assert record.config.agent == "reader"
        assert tool_results(parent.store, result.run_id)[child.call_id].content == "A."
        # the parent's totals include its child's: 2 of its own model calls, 2 of the child's
        assert (result.model_calls, result.tool_calls) == (4, 2)
        assert result.to_dict()["children"][0]["run_id"] == child.run_id


def test_budgets_come_from_the_parent_less_a_reserve_for_its_own_answer(
    tmp_path: Path, repo: Path
) -> None:
    """Two children that would each take 50 calls share what the parent has left after its
    first turn, less the one call it keeps: (8 - 1 - 1) // 2 = 3 each."""
    endless = {"turns": [{"repeat": 100, "turn": {"tool_calls": [read()]}}],
               "on_synthesis": {"text": "child: partial"}}  # fmt: skip
    reader = Agent(script(tmp_path, "child", endless), tools=file_tools(repo))
    parent = lead(
        [reader.as_tool("reader", "Reads")],
        [{"tool_calls": [delegate("reader", "one"), delegate("reader", "two")]},
         {"text": "Both read."}],
        tmp_path / "runs.sqlite",
        max_model_calls=8,
    )  # fmt: skip
    with parent:
        result = parent.run("q")
        assert result.status == "completed" and result.answer is not None
        limits = [parent.store.get_run(c.run_id).config.limits for c in result.children]  # type: ignore[union-attr]
        assert [lim.max_model_calls for lim in limits] == [3, 3]
        assert all(c.synthesized == "budget" for c in result.children)
        assert result.model_calls <= 8


LIMITS: dict[str, tuple[dict[str, Any], dict[str, Any], str]] = {
    "repeated_tool": ({}, {"turns": [{"repeat": 9, "turn": {"tool_calls": [read()]}}]},
                      "repeated_tool"),
    "model_calls": ({"max_model_calls": 3}, {}, "budget"),
    "tool_calls": ({"max_tool_calls": 2}, {}, "budget"),
    "tokens": ({"max_tokens": 9000}, {}, "budget"),
    "deadline": ({"deadline": 1.5}, {"latency_ms": 400}, "deadline"),
    "cost": ({"max_cost": 0.0012}, {"model": "openai:gpt-5-mini"}, "budget"),
}  # fmt: skip


@pytest.mark.parametrize("kind", list(LIMITS))
def test_every_limit_kind_in_a_child_comes_back_to_the_parent_as_a_synthesized_partial_result(
    tmp_path: Path, repo: Path, kind: str
) -> None:
    limits, extra, reason = LIMITS[kind]
    varied = {"repeat": 30, "turn": {"tool_calls": [read()]}}
    turns = extra.pop("turns", None) or [{"tool_calls": [read(start_line=n)]} for n in range(1, 30)]
    data = {"turns": turns, "on_synthesis": {"text": "Partial: alpha so far."}, **extra}
    del varied
    reader = Agent(script(tmp_path, "child", data), tools=file_tools(repo), limits=Limits(**limits))
    parent = lead(
        [reader.as_tool("reader", "Reads")],
        [{"tool_calls": [delegate("reader", "read a.md")]}, {"text": "From the child: alpha."}],
        tmp_path / "runs.sqlite",
    )
    with parent:
        result = parent.run("q")
        assert (result.status, result.answer) == ("completed", "From the child: alpha.")
        (child,) = result.children
        assert (child.status, child.synthesized) == ("completed", reason)
        shown = tool_results(parent.store, result.run_id)[child.call_id]
        assert not shown.is_error
        assert shown.content.startswith("[partial answer from child agent reader")
        assert f"reached its {reason} limit" in shown.content
        assert shown.content.endswith("Partial: alpha so far.")


def test_a_failed_child_gives_its_parent_an_error_result_naming_the_kind(
    tmp_path: Path, repo: Path
) -> None:
    broken = {"turns": [{"empty": True}, {"empty": True}]}
    reader = Agent(script(tmp_path, "child", broken), tools=file_tools(repo))
    parent = lead(
        [reader.as_tool("reader", "Reads")],
        [{"tool_calls": [delegate("reader", "read a.md")]}, {"text": "The reader failed."}],
        tmp_path / "runs.sqlite",
    )
    with parent:
        result = parent.run("q")
        assert (result.status, result.answer) == ("completed", "The reader failed.")
        (child,) = result.children
        assert child.status == "failed"
        shown = tool_results(parent.store, result.run_id)[child.call_id]
        assert shown.is_error and "failed: EmptyModelTurn" in shown.content


def test_a_parent_with_no_budget_left_for_a_child_answers_the_call_with_why(
    tmp_path: Path, repo: Path
) -> None:
    reader = Agent(script(tmp_path, "c", {"turns": [{"text": "x"}]}), tools=file_tools(repo))
    parent = lead(
        [reader.as_tool("reader", "Reads")],
        [{"tool_calls": [delegate("reader", "read")]}, {"text": "No reader."}],
        tmp_path / "runs.sqlite",
        max_model_calls=2,
    )
    with parent:
        result = parent.run("q")
        assert result.status == "completed" and result.children == ()
        (shown,) = tool_results(parent.store, result.run_id).values()
        assert shown.is_error and "no model calls left to give a child" in shown.content


def _own_calls(store: RunStore, run_id: str) -> int:
    """Model calls a run made itself: its total less what its children spent."""
    record = store.get_run(run_id)
    assert record is not None
    state = record.state
    return state.model_calls - sum(c.model_calls for c in state.children.values())


def _all_runs(store: RunStore) -> list[str]:
    return [r.run_id for r in store.list_runs(1000)]


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    parent_calls=st.integers(2, 12),
    fan_out=st.lists(st.integers(1, 3), min_size=1, max_size=3),
    child_calls=st.integers(1, 12),
    grandchild_calls=st.integers(1, 6),
    max_children=st.integers(1, 3),
)
def test_the_tree_never_spends_more_than_the_parents_limit_and_the_parent_always_answers(
    tmp_path_factory: pytest.TempPathFactory,
    parent_calls: int,
    fan_out: list[int],
    child_calls: int,
    grandchild_calls: int,
    max_children: int,
) -> None:
    """Random trees of two levels whose leaves never stop reading (each call new, so no loop
    rule ends them): whatever the limits, the tree's model calls stay within the parent's
    limit plus one, and the parent completes with an answer."""
    folder = tmp_path_factory.mktemp("tree")
    (folder / "a.md").write_text("alpha\n" * 50)
    endless = {"turns": [{"tool_calls": [read(start_line=n)]} for n in range(1, 60)],
               "on_synthesis": {"text": "leaf: partial"}}  # fmt: skip
    leaf = Agent(
        script(folder, "leaf", endless),
        tools=file_tools(folder),
        limits=Limits(max_model_calls=grandchild_calls),
    )
    turns: list[dict[str, Any]] = [
        {"tool_calls": [delegate("leaf", f"part {n}") for n in range(width)]} for width in fan_out
    ]
    middle = Agent(
        script(folder, "middle", {"turns": [*turns, {"text": "middle: done"}],
                                  "on_synthesis": {"text": "middle: partial"}}),
        tools=[leaf.as_tool("leaf", "Reads a part")],
        limits=Limits(max_model_calls=child_calls, max_children=max_children),
    )  # fmt: skip
    store = Store(folder / "runs.sqlite")
    parent = lead(
        [middle.as_tool("middle", "Splits the reading")],
        [{"tool_calls": [delegate("middle", "first half"), delegate("middle", "second half")]},
         {"text": "lead: done"}],
        store,
        max_model_calls=parent_calls,
        max_children=max_children,
    )  # fmt: skip
    try:
        result: RunResult = parent.run("q")
        assert result.status == "completed" and result.answer
        spent = sum(_own_calls(store, run_id) for run_id in _all_runs(store))
        assert spent == result.model_calls
        assert result.model_calls <= parent_calls + 1
    finally:
        store.close()


def test_an_approval_inside_a_child_pauses_the_parent_and_one_decision_resumes_both(
    tmp_path: Path, repo: Path
) -> None:
    write = {"name": "write_file", "arguments": {"path": "log.txt", "content": "one\n",
                                                  "append": True}}  # fmt: skip
    writer = Agent(
        script(tmp_path, "writer", {"turns": [{"tool_calls": [write]}, {"text": "Wrote one."}]}),
        tools=write_tools(repo),
    )
    parent = lead(
        [writer.as_tool("writer", "Writes")],
        [{"tool_calls": [delegate("writer", "log one")]}, {"text": "Logged."}],
        tmp_path / "runs.sqlite",
    )
    with parent:
        paused = parent.run("q")
        assert paused.status == "awaiting_approval"
        (pending,) = paused.pending_approvals
        child_id = child_run_id(paused.run_id, "k1_0")
        assert pending.run_id == child_id and pending.call_id.startswith(f"{child_id}:")
        assert pending.name == "write_file" and pending.arguments["path"] == "log.txt"
        child = parent.store.get_run(child_id)
        assert child is not None and child.status == "awaiting_approval"
        assert not (repo / "log.txt").exists()
        assert parent.approve(paused.run_id, pending.call_id) == [pending.call_id]
        done = parent.resume(paused.run_id)
        assert (done.status, done.answer) == ("completed", "Logged.")
        assert (repo / "log.txt").read_text() == "one\n"
        (finished,) = done.children
        assert finished.status == "completed"
        assert parent.store.get_run(child_id).state.answer == "Wrote one."  # type: ignore[union-attr]


def test_children_of_one_batch_run_at_once_up_to_max_children(tmp_path: Path, repo: Path) -> None:
    slow = {"turns": [{"text": "read"}], "latency_ms": 300}
    reader = Agent(script(tmp_path, "slow", slow), tools=file_tools(repo))

    def overlap(max_children: int) -> int:
        store = Store(tmp_path / f"runs{max_children}.sqlite")
        parent = lead(
            [reader.as_tool("reader", "Reads")],
            [{"tool_calls": [delegate("reader", f"part {n}") for n in range(3)]},
             {"text": "done"}],
            store,
            max_children=max_children,
        )  # fmt: skip
        try:
            result = parent.run("q")
            spans = []
            for child in result.children:
                events = store.events(child.run_id)
                spans.append((events[0].at, events[-1].at))
        finally:
            store.close()
        return max(sum(1 for s, e in spans if s <= at < e) for at, _ in spans)

    assert overlap(1) == 1
    assert overlap(3) == 3


def test_a_childs_invoke_agent_span_is_under_its_parents_execute_tool_span(
    tmp_path: Path, repo: Path, spans: Any
) -> None:
    child_model = script(tmp_path, "child", {"turns": [{"tool_calls": [read()]}, {"text": "A."}]})
    reader = Agent(child_model, tools=file_tools(repo))
    parent = lead(
        [reader.as_tool("reader", "Reads")],
        [{"tool_calls": [delegate("reader", "read a.md")]}, {"text": "A."}],
        tmp_path / "runs.sqlite",
    )
    with parent:
        result = parent.run("q")
    assert result.status == "completed"
    finished = spans.get_finished_spans()
    runs = [s for s in finished if s.name.startswith("invoke_agent")]
    tools = {s.name: s for s in finished if s.name.startswith("execute_tool")}
    assert len(runs) == 2
    child_span = next(s for s in runs if s.parent is not None)
    delegation = tools["execute_tool reader"]
    assert child_span.parent.span_id == delegation.context.span_id
    assert child_span.context.trace_id == delegation.context.trace_id


async def test_childrens_events_interleave_in_the_parents_stream_with_their_run_ids(
    tmp_path: Path, repo: Path
) -> None:
    from keel.events import ChildEvent
    from keel.records import RunCompleted, RunStarted

    child_model = script(tmp_path, "child", {"turns": [{"tool_calls": [read()]}, {"text": "A."}],
                                             "latency_ms": 50})  # fmt: skip
    reader = Agent(child_model, tools=file_tools(repo))
    parent = lead(
        [reader.as_tool("reader", "Reads")],
        [{"tool_calls": [delegate("reader", "one"), delegate("reader", "two")]},
         {"text": "Both."}],
        tmp_path / "runs.sqlite",
    )  # fmt: skip
    with parent:
        stream = parent.stream("q", text=False)
        items = [item async for item in stream]
        result = await stream
    children = {c.run_id for c in result.children}
    theirs = [i for i in items if isinstance(i, ChildEvent)]
    assert {i.run_id for i in theirs} == children
    for run_id in children:  # each child's own log, in order, within the parent's stream
        logged = [type(e) for e in parent.store.events(run_id)]
        assert [type(i.event) for i in theirs if i.run_id == run_id] == logged
    own = [i for i in items if not isinstance(i, ChildEvent)]
    assert isinstance(own[0], RunStarted) and isinstance(own[-1], RunCompleted)
    assert [e.seq for e in own] == [e.seq for e in parent.store.events(result.run_id)]
    first_child = items.index(theirs[0])
    last_child = items.index(theirs[-1])
    assert 0 < first_child < last_child < len(items) - 1  # between the parent's own events


def test_keel_ui_draws_the_tree_and_links_each_child(tmp_path: Path, repo: Path) -> None:
    from starlette.testclient import TestClient

    from keel.ui.app import create_app
    from keel.ui.security import served_hosts

    child_model = script(tmp_path, "child", {"turns": [{"text": "A."}]})
    reader = Agent(child_model, tools=file_tools(repo))
    store = tmp_path / "runs.sqlite"
    parent = lead(
        [reader.as_tool("reader", "Reads")],
        [{"tool_calls": [delegate("reader", "one"), delegate("reader", "two")]},
         {"text": "Both."}],
        store,
    )  # fmt: skip
    with parent:
        result = parent.run("q")
    app = create_app(store, served_hosts("127.0.0.1", 8350))
    with TestClient(app, base_url="http://127.0.0.1:8350") as ui:
        page = ui.get(f"/runs/{result.run_id}").text
        for child in result.children:
            assert f'<a href="/runs/{child.run_id}">{child.run_id}</a>' in page
        child_page = ui.get(f"/runs/{result.children[0].run_id}").text
        assert f'a child run of <a href="/runs/{result.run_id}">' in child_page
