"""Durable runs (ADR 0009): one process at a time advances a run. A holder whose lease was taken
over stops at once with LeaseLost, even in the middle of a long call; on both stores."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

import keel
from keel.errors import LeaseLost
from keel.transports.scripted import ScriptedTransport
from postgres import sql


async def test_heartbeat_that_finds_the_lease_taken_stops_the_run_at_once(
    store_target: str | Path,
) -> None:
    started = asyncio.Event()

    @keel.tool
    async def slow(topic: str) -> str:
        """A long read."""
        started.set()
        await asyncio.sleep(10)
        return "late"

    script = {"turns": [{"tool_calls": [{"name": "slow", "arguments": {"topic": "a"}}]}]}
    agent = keel.Agent(
        ScriptedTransport.from_dict(script), tools=[slow], store=store_target, lease_ttl=0.3
    )
    handle = agent.start("Take long.")
    await started.wait()
    # another process took the run over
    sql(store_target, "UPDATE runs SET lease_owner = 'elsewhere:1:x', lease_until = 1e12")
    begun = time.monotonic()
    with pytest.raises(LeaseLost):
        await handle
    assert time.monotonic() - begun < 2.0, "the run went on after its lease was lost"
    ((owner,),) = sql(store_target, "SELECT lease_owner FROM runs")
    assert owner == "elsewhere:1:x"  # nothing was written over the new holder
    agent.close()
