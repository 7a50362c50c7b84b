"""SYSTEM.md "Durability": one process at a time advances a run. A holder whose lease was taken
over stops at once with LeaseLost, even in the middle of a long call."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import pytest

import keel
from keel.errors import LeaseLost
from keel.transports.scripted import ScriptedTransport


async def test_heartbeat_that_finds_the_lease_taken_stops_the_run_at_once(tmp_path: Path) -> None:
    path = tmp_path / "runs.sqlite"
    started = asyncio.Event()

    @keel.tool
    async def slow(topic: str) -> str:
        """A long read."""
        started.set()
        await asyncio.sleep(10)
        return "late"

    script = {"turns": [{"tool_calls": [{"name": "slow", "arguments": {"topic": "a"}}]}]}
    agent = keel.Agent(
        ScriptedTransport.from_dict(script), tools=[slow], store=path, lease_ttl=0.3
    )
    handle = agent.start("Take long.")
    await started.wait()
    with sqlite3.connect(path) as other:  # another process took the run over
        other.execute("UPDATE runs SET lease_owner = 'elsewhere:1:x', lease_until = 1e12")
    begun = time.monotonic()
    with pytest.raises(LeaseLost):
        await handle
    assert time.monotonic() - begun < 2.0, "the run went on after its lease was lost"
    with sqlite3.connect(path) as other:
        (owner,) = other.execute("SELECT lease_owner FROM runs").fetchone()
    assert owner == "elsewhere:1:x"  # nothing was written over the new holder
    agent.close()
