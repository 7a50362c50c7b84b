"""Trees of sub-agents (ADR 0066, extending ADR 0046): depth and delegation caps answered to
the model, refused delegations spending nothing, and children whose own synthesis turns fit in
the share their parent reserved for them (issue 46's tree rows SA-02, SA-03, SA-07)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from keel import Agent, Limits, ScriptedTransport
from keel.records import ToolResultRecorded
from keel.store import RunStore, Store
from keel.subagents import delegation_tool
from keel.tools.files import file_tools
from subagent_script import delegate, make_repo, read, script


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path)


def results(store: RunStore, run_id: str) -> list[ToolResultRecorded]:
    return [e for e in store.events(run_id) if isinstance(e, ToolResultRecorded)]


def tree_runs(store: RunStore) -> list[str]:
    return [r.run_id for r in store.list_runs(1000)]


def own_spend(store: RunStore, run_id: str) -> tuple[int, int, float]:
    """Model calls, tool calls and cost a run spent itself (its totals less its children's)."""
    record = store.get_run(run_id)
    assert record is not None
    state, children = record.state, record.state.children.values()
    return (
        state.model_calls - sum(c.model_calls for c in children),
        state.tool_calls - sum(c.tool_calls for c in children),
        (state.cost or 0.0) - sum(c.cost or 0.0 for c in children),
    )


def test_sa07_a_sub_agent_delegating_to_itself_stops_at_max_depth(tmp_path: Path) -> None:
    """SA-07: without call limits, an agent whose tool is itself nested without bound. The
    depth cap (2 by default) answers the third level's delegation with why, as a tool
    result, and every level still answers."""
    model = script(tmp_path, "self", {
        "turns": [{"repeat": 50, "turn": {"tool_calls": [delegate("me", "go deeper")]}}],
        "on_synthesis": {"text": "as deep as I may go"},
    })  # fmt: skip
    unbounded = Limits(max_model_calls=None, max_tool_calls=None)
    itself = _Itself()
    agent = Agent(
        model,
        tools=[delegation_tool(itself, "me", "Does the task, delegating to itself")],
        limits=unbounded,
        store=tmp_path / "runs.sqlite",
    )
    itself.agent = agent
    with agent:
        result = agent.run("go")
        runs = tree_runs(agent.store)
        depths = {r: _depth(agent.store, r) for r in runs}
        assert max(depths.values()) <= 2
        refused = [
            e for r in runs for e in results(agent.store, r)
            if e.is_error and "max_depth" in e.content
        ]  # fmt: skip
        assert refused, "the deepest level was told why it may not delegate"
        assert result.status == "completed" and result.answer


def _depth(store: RunStore, run_id: str) -> int:
    record = store.get_run(run_id)
    assert record is not None
    parent = record.config.parent_run
    return 0 if parent is None else 1 + _depth(store, parent)


class _Itself:
    """An agent's delegation tool that runs the agent itself (set once it exists)."""

    agent: Agent

    @property
    def limits(self) -> Limits:
        return self.agent.limits

    async def arun(self, question: str) -> Any:
        return await self.agent.arun(question)

    def launch(self, opening: Any, *, listeners: Any = ()) -> Any:
        return self.agent.launch(opening, listeners=listeners)


def _endless_reader(folder: Path, name: str, **extra: Any) -> dict[str, Any]:
    """A child that never stops reading (each call new, so no loop rule ends it)."""
    return {"turns": [{"tool_calls": [read(start_line=n)]} for n in range(1, 80)],
            "on_synthesis": {"text": f"{name}: partial"}, **extra}  # fmt: skip


def _fan_out(
    tmp_path: Path,
    repo: Path,
    children: int,
    child: dict[str, Any],
    *extra: dict[str, Any],
    **limits: Any,
) -> tuple[Agent, Store]:
    reader = Agent(script(tmp_path, "child", child), tools=file_tools(repo))
    store = Store(tmp_path / "runs.sqlite")
    first = {"tool_calls": [*extra, *(delegate("reader", f"part {n}") for n in range(children))]}
    lead = Agent(
        ScriptedTransport.from_dict(
            {
                "turns": [first, {"text": "lead: done"}],
                "on_synthesis": {"text": "lead: partial"},
                **({"model": child["model"]} if "model" in child else {}),
            }
        ),
        tools=[reader.as_tool("reader", "Reads"), *file_tools(repo)],
        store=store,
        limits=Limits(**limits),
    )
    return lead, store


def test_sa03_a_refused_delegation_spends_no_tool_call_and_the_tree_keeps_max_tool_calls(
    tmp_path: Path, repo: Path
) -> None:
    """SA-03: a delegation refused for want of tool calls was counted as a tool call its
    carve had not reserved, so the tree passed `--max-tool-calls`. A refused one spends
    nothing; the calls of the batch are reserved before any child's share."""
    lead, store = _fan_out(
        tmp_path, repo, 3, _endless_reader(tmp_path, "child"), read(), max_tool_calls=4
    )
    try:
        result = lead.run("q")
        assert result.status == "completed" and result.answer
        spent = sum(own_spend(store, r)[1] for r in tree_runs(store))
        assert spent == result.tool_calls <= 4
        refused = [e for e in results(store, result.run_id) if "no tool calls left" in e.content]
        assert refused and all(e.spent is False for e in refused)
    finally:
        store.close()


def test_max_delegations_bounds_the_whole_tree_and_the_refusal_says_why(
    tmp_path: Path, repo: Path
) -> None:
    leaf = Agent(script(tmp_path, "leaf", {"turns": [{"repeat": 20, "turn": {"text": "leaf"}}]}))
    middle = Agent(
        script(
            tmp_path,
            "middle",
            {
                "turns": [
                    {
                        "repeat": 8,
                        "turn": {"tool_calls": [delegate("leaf", f"p{n}") for n in range(3)]},
                    },
                ],
                "on_synthesis": {"text": "middle: done"},
            },
        ),
        tools=[leaf.as_tool("leaf", "Leaf")],
        limits=Limits(max_model_calls=6),
    )
    store = Store(tmp_path / "runs.sqlite")
    lead = Agent(
        ScriptedTransport.from_dict(
            {
                "turns": [
                    {"tool_calls": [delegate("middle", "one"), delegate("middle", "two")]},
                    {"text": "lead: done"},
                ]
            }
        ),
        tools=[middle.as_tool("middle", "Middle")],
        store=store,
        limits=Limits(max_delegations=5),
    )
    try:
        result = lead.run("q")
        assert (result.status, result.answer) == ("completed", "lead: done")
        started = [r for r in tree_runs(store) if r != result.run_id]
        assert len(started) <= 5
        assert store.get_run(result.run_id).state.delegations == len(started)  # type: ignore[union-attr]
        told = [e for r in tree_runs(store) for e in results(store, r)
                if e.content.startswith("Error: leaf was not started")]  # fmt: skip
        assert all("max_delegations" in e.content for e in told)
        assert told and all(e.spent is False for e in told)
    finally:
        store.close()


def test_max_depth_zero_lets_a_run_delegate_nothing(tmp_path: Path, repo: Path) -> None:
    lead, store = _fan_out(tmp_path, repo, 1, {"turns": [{"text": "x"}]}, max_depth=0)
    try:
        result = lead.run("q")
        assert result.status == "completed" and result.children == ()
        (shown,) = results(store, result.run_id)
        assert shown.is_error and "depth limit (max_depth)" in shown.content
        assert result.tool_calls == 0
    finally:
        store.close()


def test_sa02_four_children_under_a_cost_limit_keep_the_tree_within_it_and_the_parent_answers(
    tmp_path: Path, repo: Path
) -> None:
    """SA-02: `--max-cost 0.01` with four children: each overshot its carve-out by its own
    synthesis turn, the tree spent more than the limit and the parent failed BudgetExhausted
    with no answer. A child's synthesis turn now fits in its share."""
    child = _endless_reader(tmp_path, "child", model="openai:gpt-5-mini")
    lead, store = _fan_out(tmp_path, repo, 4, child, max_cost=0.01)
    try:
        result = lead.run("q")
        assert result.status == "completed", result.failure
        assert result.answer in ("lead: done", "lead: partial")
        assert len(result.children) == 4
        assert all(c.synthesized == "budget" for c in result.children)
        assert result.cost is not None
        children_cost = sum(c.cost or 0.0 for c in result.children)
        record = store.get_run(result.run_id)
        assert record is not None
        # the children kept to what their parent reserved for them: its limit less its spend
        # before the batch and its reserve for its own answer
        assert children_cost <= 0.01
        assert result.cost <= 0.01 + record.state.costliest_call  # the limit plus one call
    finally:
        store.close()


def test_a_parent_whose_children_overran_their_shares_still_gets_its_answering_turn(
    tmp_path: Path, repo: Path
) -> None:
    """A child's synthesis turn is priced from how its requests grew so far; a result far
    larger than the ones before makes it cost more than that. The parent is then past its
    limit through no turn of its own: it gets its one synthesis turn (the limit plus one
    call), never a BudgetExhausted with no answer."""
    (repo / "small.md").write_text("alpha\n")
    (repo / "big.md").write_text("beta gamma delta\n" * 4000)
    child = {"turns": [{"tool_calls": [read("small.md")]}, {"tool_calls": [read("big.md")]},
                       {"repeat": 40, "turn": {"tool_calls": [read()]}}],
             "on_synthesis": {"text": "child: partial"}, "model": "openai:gpt-5-mini"}  # fmt: skip
    lead, store = _fan_out(tmp_path, repo, 4, child, max_cost=0.01)
    try:
        result = lead.run("q")
        assert (result.status, result.answer) == ("completed", "lead: partial")
        assert result.synthesized == "budget"
        record = store.get_run(result.run_id)
        assert record is not None and not record.state.answer_owed
        assert sum(c.cost or 0.0 for c in result.children) > 0.01 - record.state.costliest_call
    finally:
        store.close()


def test_an_agent_table_names_the_agents_it_starts_but_never_itself_or_one_above_it(
    tmp_path: Path, repo: Path
) -> None:
    """`[agents.NAME] agents = [...]` (ADR 0069): a deeper tree from saved tables, offered to the
    agent that names it only; a cycle is refused when the agents are built, naming it."""
    from keel.assemble import build_agent
    from keel.errors import ConfigError

    def table(*below: str) -> dict[str, Any]:
        return {"description": "d", "model": None, "instructions": None, "tools": ["read_file"],
                "approve_tools": [], "limits": {}, "agents": list(below)}  # fmt: skip

    store = tmp_path / "runs.sqlite"
    script = tmp_path / "x.json"
    script.write_text(json.dumps({"turns": [{"text": "done"}]}))
    tables: dict[str, Any] = {"middle": table("leaf"), "leaf": {**table(), "below": True}}
    lead = build_agent(f"script:{script}", {"repo": str(repo), "agents": tables}, Limits(),
                       store, None)  # fmt: skip
    assert [t.name for t in lead.tools if t.delegates] == ["middle"]
    cycle = {"a": table("b"), "b": {**table("a"), "below": True}}
    with pytest.raises(ConfigError, match="'a' is not an agent it may start"):
        build_agent(f"script:{script}", {"repo": str(repo), "agents": cycle}, Limits(), store,
                    None)  # fmt: skip
