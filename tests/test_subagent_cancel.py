"""Cancelling a tree of runs (ADR 0066): every descendant ends `cancelled`, durably, on SQLite
and on a real Postgres; in-flight model calls stop; a child started after the cancel was
recorded never calls its model (issue 46's SA-10, and the final-checkpoint race of ADR 0062)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from keel import Agent, Limits, ScriptedTransport
from keel.records import RunCompleted
from keel.store import RunStore, open_store
from keel.subagents import delegation_tool
from keel.tools.base import make_tool
from keel.tools.writes import write_tools
from subagent_script import delegate, script

pytest_plugins = ["postgres"]

SLOW = 20_000
"""Milliseconds a slow scripted model takes to answer: far past any test's wait, so a run
that ends quickly was stopped, not finished."""


def three_levels(folder: Path, store: RunStore | str | Path, width: int = 2) -> Agent:
    """A lead delegating to `width` middles, each delegating to `width` slow leaves."""
    leaf = Agent(script(folder, "leaf", {"turns": [{"repeat": 50, "turn": {"text": "leaf"}}],
                                         "latency_ms": SLOW}))  # fmt: skip
    fan = {"tool_calls": [delegate("leaf", f"part {n}") for n in range(width)]}
    middle = Agent(
        script(
            folder,
            "middle",
            {"turns": [{"repeat": 20, "turn": fan}], "on_synthesis": {"text": "middle"}},
        ),
        tools=[leaf.as_tool("leaf", "Reads a part")],
    )
    lead_fan = {"tool_calls": [delegate("middle", f"half {n}") for n in range(width)]}
    return Agent(
        ScriptedTransport.from_dict({"turns": [lead_fan, {"text": "lead"}]}),
        tools=[middle.as_tool("middle", "Splits")],
        store=store,
        limits=Limits(max_children=8),
    )


def tree(store: RunStore, root: str) -> dict[str, str]:
    """Every run of the tree under `root`, with its status."""
    found, todo = {}, [root]
    runs = store.list_runs(1000)
    while todo:
        run_id = todo.pop()
        record = store.get_run(run_id)
        assert record is not None
        found[run_id] = record.status
        todo += [r.run_id for r in runs if r.config.parent_run == run_id]
    return found


async def until(check: Any, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.05)


def leaves_running(store: RunStore, width: int = 2) -> bool:
    runs = store.list_runs(1000)
    return sum(1 for r in runs if r.status == "running") == 1 + width + width * width


async def test_sa10_cancelling_a_fan_out_cancels_every_descendant(tmp_path: Path) -> None:
    """SA-10: SIGTERM in a fan-out (the CLI cancels the run's handle) recorded the parent
    `cancelled` and left its children `running`. Each child now ends `cancelled`, and the
    tree's in-flight model calls stop (the leaves' answers were 20 s away)."""
    lead = three_levels(tmp_path, tmp_path / "runs.sqlite")
    with lead:
        handle = lead.start("q")
        await until(lambda: leaves_running(lead.store))
        started = time.monotonic()
        handle.cancel()
        result = await handle
        took = time.monotonic() - started
        statuses = tree(lead.store, result.run_id)
    assert result.status == "cancelled"
    assert len(statuses) == 7 and set(statuses.values()) == {"cancelled"}, statuses
    assert took < 5.0


def test_a_cancel_recorded_in_the_store_stops_a_tree_advanced_elsewhere(
    tmp_path: Path, store_target: str | Path
) -> None:
    """`keel cancel` from another process: the request is durable; the process advancing the
    tree sees it within its poll and cancels every run of it."""
    lead = three_levels(tmp_path, store_target)
    outcome: dict[str, Any] = {}

    async def drive() -> None:
        handle = lead.start("q")
        outcome["run_id"] = handle.run_id
        outcome["result"] = await handle

    runner = threading.Thread(target=asyncio.run, args=(drive(),))
    with lead:
        runner.start()
        other = open_store(store_target)
        try:
            deadline = time.monotonic() + 20
            while not leaves_running(other):
                assert time.monotonic() < deadline
                time.sleep(0.05)
            started = time.monotonic()
            asked = other.request_cancel(outcome["run_id"])
            assert len(asked) == 7  # the whole tree, none of it ended yet
            runner.join(15)
            took = time.monotonic() - started
            assert not runner.is_alive()
            statuses = tree(other, outcome["run_id"])
        finally:
            other.close()
    assert outcome["result"].status == "cancelled"
    assert set(statuses.values()) == {"cancelled"}, statuses
    assert took < 5.0


async def test_a_child_started_after_the_cancel_was_recorded_calls_no_model(
    tmp_path: Path,
) -> None:
    """The cancel is recorded after the lead's last look at the store (the checkpoint before
    its children start) and before its child opens: the child ends `cancelled` at once,
    without a model call, and the lead is cancelled at its next checkpoint."""
    store_path = tmp_path / "runs.sqlite"
    child = Agent(script(tmp_path, "child", {"turns": [{"text": "never"}]}))
    lead = Agent(
        ScriptedTransport.from_dict(
            {"turns": [{"tool_calls": [delegate("child", "task")]}, {"text": "lead"}]}
        ),
        tools=[delegation_tool(_CancelFirst(child, store_path), "child", "Child")],
        store=store_path,
    )
    with lead:
        result = await lead.start("q")
        statuses = tree(lead.store, result.run_id)
        children = [r for r in statuses if r != result.run_id]
        assert result.status == "cancelled"
        assert len(children) == 1
        record = lead.store.get_run(children[0])
        assert record is not None
        assert (record.status, record.state.model_calls) == ("cancelled", 0)


class _CancelFirst:
    """A child agent whose start is preceded by a cancel of the whole tree, recorded by
    another store handle (as `keel cancel` in another process would)."""

    def __init__(self, agent: Agent, store: Path) -> None:
        self.agent, self.store = agent, store

    @property
    def limits(self) -> Limits:
        return self.agent.limits

    async def arun(self, question: str) -> Any:
        raise AssertionError("only called outside a run")

    def launch(self, opening: Any, *, listeners: Any = ()) -> Any:
        other = open_store(self.store)
        try:
            other.request_cancel(opening.parent_run)
        finally:
            other.close()
        return self.agent.launch(opening, listeners=listeners)


def test_keel_cancel_ends_a_paused_tree_cancelled(tmp_path: Path, store_target: str | Path) -> None:
    """A tree nobody advances (paused on a child's approval): `keel cancel` ends each run of
    it `cancelled` at once, its event recorded; `keel resume` could continue it."""
    from keel.cli.app import app

    repo = tmp_path / "repo"
    repo.mkdir()
    write = {"name": "write_file", "arguments": {"path": "x.txt", "content": "x"}}
    writer = Agent(
        script(tmp_path, "writer", {"turns": [{"tool_calls": [write]}, {"text": "w"}]}),
        tools=write_tools(repo),
    )
    store = store_target
    lead = Agent(
        ScriptedTransport.from_dict({"turns": [{"tool_calls": [delegate("writer", "w")]}]}),
        tools=[writer.as_tool("writer", "Writes")],
        store=store,
    )
    with lead:
        paused = lead.run("q")
    assert paused.status == "awaiting_approval"
    out = CliRunner().invoke(app, ["cancel", paused.run_id, "--store", str(store)])
    assert out.exit_code == 0, out.output
    assert "cancelled 2 runs" in out.output
    reader = open_store(store)
    try:
        statuses = tree(reader, paused.run_id)
        assert set(statuses.values()) == {"cancelled"} and len(statuses) == 2
        kinds = [e.type for e in reader.events(paused.run_id)]
        assert kinds[-1] == "run_cancelled"
    finally:
        reader.close()


async def test_a_cancel_during_the_last_checkpoint_leaves_the_ending_as_it_was(
    tmp_path: Path,
) -> None:
    """ADR 0062 saw it: a SIGTERM landing while a finished run's last checkpoint was saved
    escaped as a CancelledError traceback. The run has ended; its ending is saved and
    returned."""
    holder: dict[str, Any] = {}

    def on_event(event: object) -> None:
        if isinstance(event, RunCompleted):  # recorded just before the last checkpoint
            asyncio.get_running_loop().call_soon(holder["handle"]._task.cancel)

    agent = Agent(
        ScriptedTransport.from_dict({"turns": [{"text": "done"}]}),
        store=tmp_path / "runs.sqlite",
        listeners=[on_event],
    )
    with agent:
        holder["handle"] = handle = agent.start("q")
        result = await handle
        assert (result.status, result.answer) == ("completed", "done")
        record = agent.store.get_run(result.run_id)
        assert record is not None and record.status == "completed"


def test_sa10_sigterm_to_keel_run_in_a_fan_out_leaves_no_child_running(tmp_path: Path) -> None:
    """SA-10 as found: `keel run --agent ...` with three children, SIGTERM while they wait on
    their models. Every run of the tree ends `cancelled`; exit code 1, no traceback."""
    import os
    import signal
    import subprocess
    import sys

    config = tmp_path / "config" / "keel"
    config.mkdir(parents=True)
    slow = script(tmp_path, "slow", {"turns": [{"text": "late"}], "latency_ms": SLOW})
    config.joinpath("keel.toml").write_text(
        f'[agents.slow]\ndescription = "Answers slowly"\nmodel = "{slow}"\ntools = []\n'
    )
    fan = {"tool_calls": [delegate("slow", f"part {n}") for n in range(3)]}
    lead = script(tmp_path, "lead", {"turns": [fan, {"text": "done"}]})
    store = tmp_path / "runs.sqlite"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL")}
    env["XDG_CONFIG_HOME"] = str(tmp_path / "config")
    process = subprocess.Popen(
        [sys.executable, "-m", "keel", "run", "q", "--model", lead, "--agent", "slow",
         "--store", str(store)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            assert time.monotonic() < deadline and process.poll() is None
            if store.exists():
                reader = open_store(store, read_only=True)
                try:
                    running = [r for r in reader.list_runs(50) if r.status == "running"]
                finally:
                    reader.close()
                if len(running) == 4:
                    break
            time.sleep(0.1)
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 1, err
    assert "Traceback" not in err, err
    reader = open_store(store, read_only=True)
    try:
        statuses = {r.run_id: r.status for r in reader.list_runs(50)}
    finally:
        reader.close()
    assert len(statuses) == 4 and set(statuses.values()) == {"cancelled"}, statuses


async def test_a_cancel_seen_at_a_side_effects_checkpoint_cancels_the_run_not_the_tool(
    tmp_path: Path,
) -> None:
    """A side effect's result is checkpointed in its tool's own task. A cancel found there
    cancels the run: its next model call is never sent."""
    from keel.tools.base import Effect

    store_path = tmp_path / "runs.sqlite"
    holder: dict[str, str] = {}

    def mark() -> str:
        """Mark the work as done (and, meanwhile, someone cancels the run)."""
        other = open_store(store_path)
        try:
            other.request_cancel(holder["run_id"])
        finally:
            other.close()
        return "marked"

    agent = Agent(
        ScriptedTransport.from_dict(
            {"turns": [{"tool_calls": [{"name": "mark", "arguments": {}}]}, {"text": "never"}]}
        ),
        tools=[make_tool(mark, effect=Effect.SIDE_EFFECTING)],
        approve_tools=["mark"],
        store=store_path,
    )
    with agent:
        handle = agent.start("q")
        holder["run_id"] = handle.run_id
        result = await handle
    assert (result.status, result.model_calls, result.tool_calls) == ("cancelled", 1, 1)


async def test_a_child_resumed_with_its_parent_is_cancelled_with_it(tmp_path: Path) -> None:
    """A delegation run again on the parent's resume resumes its child; cancelling the parent
    then ends that child `cancelled` too, not `running`."""
    repo = tmp_path / "repo"
    repo.mkdir()

    async def wait_long() -> str:
        """Wait for something slow."""
        await asyncio.sleep(SLOW / 1000)
        return "waited"

    write = {"name": "write_file", "arguments": {"path": "x.txt", "content": "x"}}
    slow = {"name": "wait_long", "arguments": {}}
    writer = Agent(
        script(
            tmp_path,
            "writer",
            {"turns": [{"tool_calls": [write]}, {"tool_calls": [slow]}, {"text": "w"}]},
        ),
        tools=[*write_tools(repo), make_tool(wait_long)],
    )
    lead = Agent(
        ScriptedTransport.from_dict(
            {"turns": [{"tool_calls": [delegate("writer", "w")]}, {"text": "lead"}]}
        ),
        tools=[writer.as_tool("writer", "Writes")],
        store=tmp_path / "runs.sqlite",
    )
    with lead:
        paused = await lead.start("q")
        assert paused.status == "awaiting_approval"
        (pending,) = paused.pending_approvals
        lead.approve(paused.run_id, pending.call_id)
        handle = lead.start_resume(paused.run_id)
        await until(lambda: (repo / "x.txt").exists())
        await asyncio.sleep(0.3)  # the child is in its slow call now
        handle.cancel()
        result = await handle
        statuses = tree(lead.store, result.run_id)
    assert result.status == "cancelled"
    assert set(statuses.values()) == {"cancelled"} and len(statuses) == 2, statuses


def test_a_store_opened_before_the_cancels_table_gets_it_and_keeps_its_version(
    tmp_path: Path, store_target: str | Path
) -> None:
    """The table is created on open, with no new schema version: a store an older Keel wrote
    works for `keel cancel`, and an older Keel still reads a store this one opened."""
    import sqlite3

    import psycopg

    agent = Agent(ScriptedTransport.from_dict({"turns": [{"text": "a"}]}), store=store_target)
    with agent:
        result = agent.run("q")
    if isinstance(store_target, Path):
        with sqlite3.connect(store_target) as db:
            db.execute("DROP TABLE cancels")
            version = db.execute("PRAGMA user_version").fetchone()[0]
    else:
        with psycopg.connect(store_target, autocommit=True) as pg:
            pg.execute("DROP TABLE keel.cancels")
            row = pg.execute("SELECT version FROM keel.schema_version").fetchone()
            version = row[0] if row else None
    assert version == 4
    store = open_store(store_target)
    try:
        assert store.request_cancel(result.run_id) == []  # ended: nothing to cancel
        assert not store.cancel_requested(result.run_id)
    finally:
        store.close()
