"""MCP servers' tools under every Keel rule: a real server written with the `mcp` package
(`mcp_server.py`), started over stdio and over streamable HTTP on loopback; scripted models."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

import keel
from keel.records import ApprovalRequested, ModelRequestSent, ToolResultRecorded
from mcp_support import call, calls, http_server, kill, server_pids, stdio_server
from support import batch, run_script

ANSWER = {"text": "A lease is held by one process at a time."}


@pytest.fixture
def log(tmp_path: Path) -> Path:
    return tmp_path / "calls.jsonl"


async def test_mcp_tools_keep_their_schemas_and_take_effects_from_annotations(log: Path) -> None:
    async with keel.mcp_tools(stdio_server(log, name="glossary")) as mcp:
        tools = {t.name: t for t in mcp}
    assert set(tools) == {"lookup", "add_note", "explode", "nap"}
    assert tools["lookup"].effect is keel.Effect.READ_ONLY
    assert tools["lookup"].requires_approval is False
    assert tools["add_note"].effect is keel.Effect.SIDE_EFFECTING  # readOnlyHint false
    assert tools["add_note"].requires_approval is True
    schema = tools["add_note"].parameters
    assert schema["required"] == ["text"]
    assert set(schema["properties"]) == {"text", "linger"}
    assert tools["lookup"].description == "Look a term up in the glossary."


async def test_an_mcp_server_that_fails_to_start_is_a_config_error_naming_it(log: Path) -> None:
    server = stdio_server(log, "--fail-start", name="broken")
    with pytest.raises(keel.ConfigError, match="'broken' could not be used"):
        async with keel.mcp_tools(server):
            pass
    with pytest.raises(keel.ConfigError, match="no such program"):
        async with keel.mcp_tools(keel.McpServer.stdio("/nonexistent/mcp-server")):
            pass


async def test_an_mcp_server_that_never_answers_is_a_config_error_not_a_hang() -> None:
    started = time.monotonic()
    with pytest.raises(keel.ConfigError, match="did not answer within 1s"):
        async with keel.mcp_tools(keel.McpServer.stdio("sleep 30", connect_timeout=1)):
            pass
    assert time.monotonic() - started < 15


async def test_mcp_tool_name_clash_is_refused_naming_both_servers(log: Path) -> None:
    one, two = stdio_server(log, name="one"), stdio_server(log, name="two")
    with pytest.raises(keel.ConfigError, match="offered by two MCP servers, 'one' and 'two'"):
        async with keel.mcp_tools(one, two):
            pass
    with pytest.raises(keel.ConfigError, match="two MCP servers are named 'one'"):
        keel.mcp_tools(one, one)


async def test_a_prefix_tells_two_servers_tools_apart(log: Path) -> None:
    one, two = stdio_server(log, name="one"), stdio_server(log, name="two", prefix="b_")
    async with keel.mcp_tools(one, two) as mcp:
        out = await run_script({"turns": [call("b_lookup", term="lease"), ANSWER]}, mcp.tools)
    assert out.result.status == "completed"
    assert calls(log) == [
        {"tool": "lookup", "arguments": {"term": "lease"}, "pid": calls(log)[0]["pid"]}
    ]


async def test_an_mcp_call_outside_the_schema_is_answered_without_reaching_the_server(
    log: Path,
) -> None:
    async with keel.mcp_tools(stdio_server(log)) as mcp:
        out = await run_script({"turns": [call("lookup", word="lease"), ANSWER]}, mcp.tools)
    (result,) = out.of_type(ToolResultRecorded)
    assert result.is_error and "'term' is a required property" in result.content
    assert calls(log) == []


async def test_an_erroring_mcp_tool_gives_an_error_result_and_the_run_goes_on(log: Path) -> None:
    async with keel.mcp_tools(stdio_server(log)) as mcp:
        out = await run_script({"turns": [call("explode", reason="boom"), ANSWER]}, mcp.tools)
    (result,) = out.of_type(ToolResultRecorded)
    assert result.is_error and "exploded: boom" in result.content
    assert out.result.status == "completed"


async def test_a_sleeping_mcp_tool_times_out_into_an_error_result_without_a_hang(
    log: Path,
) -> None:
    server = stdio_server(log, timeout=0.5)
    async with keel.mcp_tools(server) as mcp:
        started = time.monotonic()
        out = await run_script(
            {"turns": [call("nap", seconds=30), call("lookup", term="lease"), ANSWER]}, mcp.tools
        )
        elapsed = time.monotonic() - started
    nap, lookup = out.of_type(ToolResultRecorded)
    assert nap.is_error and "timed out" in nap.content and not nap.uncertain
    assert not lookup.is_error  # the connection survived the abandoned call
    assert out.result.status == "completed" and elapsed < 10


async def test_a_repeated_mcp_call_gets_the_synthesis_turn_at_threshold_minus_one(
    log: Path,
) -> None:
    script = {"turns": [call("lookup", term="lease")] * 4, "on_synthesis": ANSWER}
    async with keel.mcp_tools(stdio_server(log)) as mcp:
        out = await run_script(script, mcp.tools, loop_threshold=5)
    assert out.result.status == "completed"
    assert out.result.synthesized == "repeated_tool"
    assert [r.synthesis for r in out.of_type(ModelRequestSent)] == [None] * 4 + ["repeated_tool"]
    assert len(calls(log, "lookup")) == 4


async def test_the_hard_breaker_stops_a_repeated_mcp_batch_before_the_server_sees_it(
    log: Path,
) -> None:
    lookup = ("lookup", {"term": "lease"})
    script = {"turns": [call("lookup", term="lease"), batch(lookup, lookup)]}
    async with keel.mcp_tools(stdio_server(log)) as mcp:
        out = await run_script(script, mcp.tools, loop_threshold=3)
    assert out.result.status == "failed"
    assert out.result.failure is not None and out.result.failure.kind == "ToolLoopDetected"
    assert len(calls(log, "lookup")) == 1  # the tripping batch never reached the server


async def test_a_side_effecting_mcp_tool_pauses_for_approval_and_resume_reconnects(
    log: Path, tmp_path: Path
) -> None:
    store = keel.Store(tmp_path / "runs.sqlite")
    script = keel.ScriptedTransport.from_dict({"turns": [call("add_note", text="hello"), ANSWER]})
    async with keel.mcp_tools(stdio_server(log)) as mcp:
        agent = keel.Agent(script, tools=mcp.tools, store=store)
        paused = await agent.arun("Note it.")
    assert paused.status == "awaiting_approval"
    assert [e.name for e in store.events(paused.run_id) if isinstance(e, ApprovalRequested)] == [
        "add_note"
    ]
    assert calls(log, "add_note") == []
    agent.approve(paused.run_id, by="ana")

    async with keel.mcp_tools(stdio_server(log)) as mcp:  # a new connection, a new server
        agent = keel.Agent(script, tools=mcp.tools, store=store)
        done = await agent.aresume(paused.run_id)
    assert done.status == "completed"
    assert [c["arguments"]["text"] for c in calls(log, "add_note")] == ["hello"]
    assert len(set(server_pids(log))) == 2
    store.close()


async def test_a_pre_approved_side_effecting_mcp_tool_runs_without_asking(log: Path) -> None:
    async with keel.mcp_tools(stdio_server(log, approve=["add_note"])) as mcp:
        out = await run_script({"turns": [call("add_note", text="hi"), ANSWER]}, mcp.tools)
    assert out.result.status == "completed" and out.of_type(ApprovalRequested) == []
    assert len(calls(log, "add_note")) == 1
    with pytest.raises(keel.ConfigError, match="has no tool named publish"):
        async with keel.mcp_tools(stdio_server(log, approve=["publish"])):
            pass


async def test_an_mcp_server_killed_mid_run_gives_an_error_result_and_the_run_ends_classified(
    log: Path,
) -> None:
    script = {"turns": [call("nap", seconds=20), call("lookup", term="lease"), ANSWER]}
    async with keel.mcp_tools(stdio_server(log)) as mcp:

        async def kill_during_nap() -> None:
            while not calls(log, "nap"):
                await asyncio.sleep(0.02)
            kill(server_pids(log)[-1])

        killer = asyncio.create_task(kill_during_nap())
        out = await run_script(script, mcp.tools)
        await killer
    nap, lookup = out.of_type(ToolResultRecorded)
    assert nap.is_error and "lost its connection" in nap.content and not nap.uncertain
    assert not lookup.is_error  # the next call started the server again
    assert out.result.status == "completed"
    assert len(set(server_pids(log))) == 2


async def test_the_server_dying_during_a_side_effecting_call_is_effect_unknown(
    log: Path,
) -> None:
    script = {"turns": [call("add_note", text="once", linger=20), ANSWER]}
    async with keel.mcp_tools(stdio_server(log, approve=["add_note"])) as mcp:

        async def kill_during_note() -> None:
            while not calls(log, "add_note"):
                await asyncio.sleep(0.02)
            kill(server_pids(log)[-1])

        killer = asyncio.create_task(kill_during_note())
        out = await run_script(script, mcp.tools)
        await killer
    (note,) = out.of_type(ToolResultRecorded)
    assert note.uncertain and note.content.startswith("Effect unknown")
    assert out.result.status == "completed"
    assert len(calls(log, "add_note")) == 1


async def test_mcp_tools_over_streamable_http(log: Path) -> None:
    with http_server(log) as url:
        server = keel.McpServer.http(url, approve=["add_note"])
        script = {
            "turns": [
                call("lookup", term="lease"),
                call("add_note", text="over http"),
                call("explode", reason="http"),
                ANSWER,
            ]
        }
        async with keel.mcp_tools(server) as mcp:
            out = await run_script(script, mcp.tools)
    lookup, note, explode = out.of_type(ToolResultRecorded)
    assert "held by one process" in lookup.content
    assert note.content == "noted: over http" and not note.is_error
    assert explode.is_error and "exploded: http" in explode.content
    assert out.result.status == "completed"
    assert [c["tool"] for c in calls(log)] == ["lookup", "add_note", "explode"]


def test_the_toolset_works_from_blocking_code_and_stops_its_server(log: Path) -> None:
    with keel.mcp_tools(stdio_server(log)) as mcp:
        agent = keel.Agent(
            keel.ScriptedTransport.from_dict({"turns": [call("lookup", term="lease"), ANSWER]}),
            tools=mcp.tools,
            store=":memory:",
        )
        assert agent.run("What is a lease?").status == "completed"
        assert agent.run  # a second asyncio.run would reuse the same connection
    (pid,) = server_pids(log)
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)
    with pytest.raises(keel.ConfigError, match="open the MCP toolset first"):
        list(keel.mcp_tools(stdio_server(log)))


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except FileNotFoundError:
        return False
