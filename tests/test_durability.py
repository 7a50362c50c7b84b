"""Approvals, denial, uncertain effect (ADR 0010) and durable runs (ADR 0009), through the
library."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

import keel
from keel._run.resume import load
from keel.store import LeaseHeld
from keel.transports.scripted import ScriptedTransport

ANSWER = {"text": "Done: the note is written."}


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    (root / "notes.md").write_text("# Notes\nLeases expire.\n")
    return root


def agent_for(
    script: dict[str, Any], repo: Path, store: keel.Store, **limits: Any
) -> tuple[keel.Agent, ScriptedTransport]:
    transport = ScriptedTransport.from_dict(script, record=True)
    tools = [*keel.file_tools(repo), *keel.write_tools(repo)]
    return keel.Agent(transport, tools=tools, store=store, limits=keel.Limits(**limits)), transport


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


async def test_call_requiring_approval_pauses_and_approved_call_runs_on_resume(
    repo: Path, tmp_path: Path
) -> None:
    store = keel.Store(tmp_path / "runs.sqlite")
    script = {"turns": [call("write_file", path="out.txt", content="hello\n", append=True), ANSWER]}
    agent, _ = agent_for(script, repo, store)
    paused = await agent.arun("Write the note.")
    assert paused.status == "awaiting_approval"
    assert not (repo / "out.txt").exists()
    (pending,) = agent.pending_approvals(paused.run_id)
    assert pending.name == "write_file"

    assert agent.approve(paused.run_id, by="ana") == [pending.call_id]
    # A new agent (as a new process would build) continues from the store.
    resumed_agent, transport = agent_for(script, repo, store)
    result = await resumed_agent.aresume(paused.run_id)
    assert result.status == "completed" and result.answer == ANSWER["text"]
    assert lines(repo / "out.txt") == ["hello"]
    assert transport.consumed == 2  # the resumed script continued where it stood
    events = store.events(paused.run_id)
    decided = [e for e in events if e.type == "approval_decided"]
    assert decided[0].approved and decided[0].by == "ana"
    assert result.model_calls == 2 and result.tool_calls == 1


async def test_denial_reaches_the_model_and_an_identical_call_is_denied_again_without_asking(
    repo: Path, tmp_path: Path
) -> None:
    store = keel.Store(tmp_path / "runs.sqlite")
    write = call("write_file", path="out.txt", content="x\n")
    script = {"turns": [write, write, ANSWER]}
    agent, _ = agent_for(script, repo, store, loop_threshold=5)
    paused = await agent.arun("Write it.")
    (pending,) = agent.pending_approvals(paused.run_id)
    agent.deny(paused.run_id, pending.call_id, reason="not in this repo", by="ana")

    resumed, transport = agent_for(script, repo, store, loop_threshold=5)
    result = await resumed.aresume(paused.run_id)
    assert result.status == "completed"
    assert not (repo / "out.txt").exists()
    results = [e for e in store.events(paused.run_id) if e.type == "tool_result"]
    assert "Denied by ana: not in this repo" in results[0].content
    assert "Do not request it again" in results[0].content
    assert "Denied again without asking" in results[1].content
    assert [e.type for e in store.events(paused.run_id)].count("approval_requested") == 1
    assert (
        store.counters(paused.run_id)['write_file {"content":"x\\n","path":"out.txt"}'].count == 2
    )
    denial = transport.requests[-1].items[-1]
    assert isinstance(denial, keel.ToolResult) and denial.is_error


async def test_repeated_denials_count_toward_the_breaker(repo: Path, tmp_path: Path) -> None:
    store = keel.Store(tmp_path / "runs.sqlite")
    write = call("write_file", path="out.txt", content="x\n")
    script = {"turns": [write, write, write], "on_synthesis": ANSWER}
    agent, _ = agent_for(script, repo, store, loop_threshold=3)
    paused = await agent.arun("Write it.")
    agent.deny(paused.run_id, agent.pending_approvals(paused.run_id)[0].call_id, reason="no")
    resumed, _ = agent_for(script, repo, store, loop_threshold=3)
    result = await resumed.aresume(paused.run_id)
    # Two answered denials leave the counter at T-1: the next turn is synthesis-only.
    assert result.synthesized == "repeated_tool"


async def test_resume_at_threshold_minus_one_starts_with_the_synthesis_turn(
    repo: Path, tmp_path: Path
) -> None:
    store = keel.Store(tmp_path / "runs.sqlite")
    read = call("read_file", path="notes.md")
    both = {
        "tool_calls": [
            {"name": "read_file", "arguments": {"path": "notes.md"}},
            {"name": "write_file", "arguments": {"path": "o.txt", "content": "a"}},
        ]
    }
    script = {"turns": [read, both], "on_synthesis": ANSWER}
    agent, _ = agent_for(script, repo, store, loop_threshold=3)
    paused = await agent.arun("Read, then write.")
    assert paused.status == "awaiting_approval"
    assert store.counters(paused.run_id)['read_file {"path":"notes.md"}'].count == 2
    agent.approve(paused.run_id)

    resumed, transport = agent_for(script, repo, store, loop_threshold=3)
    result = await resumed.aresume(paused.run_id)
    assert result.status == "completed" and result.synthesized == "repeated_tool"
    assert [r.tool_choice for r in transport.requests] == ["none"]
    assert lines(repo / "o.txt") == ["a"]


async def test_resumed_request_is_what_it_would_have_been(repo: Path, tmp_path: Path) -> None:
    """Same history, same elisions, same frozen prefix after a pause."""
    big = "Leases expire. " * 3000
    (repo / "big.md").write_text(big)
    turns = [
        call("read_file", path="big.md"),
        call("read_file", path="notes.md"),
        call("write_file", path="o.txt", content="a"),
        call("read_file", path="x.md"),
        ANSWER,
    ]
    store = keel.Store(tmp_path / "runs.sqlite")
    agent, _ = agent_for({"turns": turns}, repo, store, context_tokens=6_000)
    paused = await agent.arun("q")
    agent.approve(paused.run_id)
    resumed, second = agent_for({"turns": turns}, repo, store, context_tokens=6_000)
    await resumed.aresume(paused.run_id)

    uninterrupted_store = keel.Store(tmp_path / "other.sqlite")
    straight, third = agent_for({"turns": turns}, repo, uninterrupted_store, context_tokens=6_000)
    straight.approve_tools = frozenset({"write_file"})
    await straight.arun("q")
    assert second.requests[0].items == third.requests[3].items
    assert second.requests[0].system == third.requests[3].system
    assert any(getattr(i, "elided", False) for i in second.requests[0].items)


async def test_a_finished_run_cannot_be_resumed(repo: Path, tmp_path: Path) -> None:
    store = keel.Store(tmp_path / "runs.sqlite")
    agent, _ = agent_for({"turns": [ANSWER]}, repo, store)
    done = await agent.arun("q")
    with pytest.raises(keel.ConfigError, match="already ended"):
        load(store, done.run_id)


async def test_a_live_lease_refuses_a_second_process_and_an_expired_one_is_taken_over(
    repo: Path, tmp_path: Path
) -> None:
    store = keel.Store(tmp_path / "runs.sqlite")
    agent, _ = agent_for({"turns": [call("write_file", path="o", content="a")]}, repo, store)
    paused = await agent.arun("q")
    # A holder on another host, lease still running: refused.
    await store.acquire_lease(paused.run_id, "elsewhere:1:abc", ttl=60)
    with pytest.raises(LeaseHeld, match="another process"):
        await store.acquire_lease(paused.run_id, "here:2:def", ttl=60)
    # The same holder whose lease ran out: taken over.
    await store.acquire_lease(paused.run_id, "elsewhere:1:abc", ttl=0.01)
    time.sleep(0.05)
    await store.acquire_lease(paused.run_id, "here:2:def", ttl=60)


async def test_a_dead_local_holder_is_taken_over_at_once(repo: Path, tmp_path: Path) -> None:
    from keel.store.sqlite_store import HOST

    store = keel.Store(tmp_path / "runs.sqlite")
    agent, _ = agent_for({"turns": [call("write_file", path="o", content="a")]}, repo, store)
    paused = await agent.arun("q")
    await store.acquire_lease(paused.run_id, f"{HOST}:999999999:dead", ttl=600)
    await store.acquire_lease(paused.run_id, f"{HOST}:1:alive", ttl=600)


def test_store_file_of_the_first_schema_is_migrated(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "old.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript(
        "CREATE TABLE runs (run_id TEXT PRIMARY KEY, created_at REAL NOT NULL, updated_at REAL"
        " NOT NULL, question TEXT NOT NULL, model TEXT NOT NULL, status TEXT NOT NULL, config"
        " TEXT NOT NULL, state TEXT NOT NULL); PRAGMA user_version=1;"
        "INSERT INTO runs VALUES ('run_old', 1, 1, 'q', 'm', 'completed', '{}', '{}');"
    )
    conn.close()
    store = keel.Store(path)
    record = store.get_run("run_old")
    assert record is not None and record.question == "q"
    store.close()
    columns = {r[1] for r in sqlite3.connect(path).execute("PRAGMA table_info(runs)")}
    assert {"lease_owner", "lease_until"} <= columns


async def test_a_holder_whose_lease_was_taken_over_must_stop_writing(
    repo: Path, tmp_path: Path
) -> None:
    store = keel.Store(tmp_path / "runs.sqlite")
    agent, _ = agent_for({"turns": [call("write_file", path="o", content="a")]}, repo, store)
    paused = await agent.arun("q")
    await store.acquire_lease(paused.run_id, "elsewhere:1:old", ttl=0.01)
    time.sleep(0.05)
    await store.acquire_lease(paused.run_id, "elsewhere:2:new", ttl=60)
    with pytest.raises(keel.LeaseLost, match="taken over"):
        await store.renew_lease(paused.run_id, "elsewhere:1:old", ttl=60)
