"""Cancelling a three-level tree at random moments (ADR 0066), for `benchmarks/subagents.py`.

A lead delegates to WIDTH middles, each to WIDTH leaves; every model is scripted with a small
delay and every run keeps calling a tool, so the whole tree is busy when the cancel comes. At a
random moment another store handle records the cancel (`request_cancel`, as `keel cancel` from
another process does). Measured per trial:

- model calls started after the cancel was recorded, against the runs that had not ended then
  (the bound: the one call a run may have had in flight; a call whose request was being built
  is checked at its checkpoint and never sent);
- time to quiescence: from the recorded cancel until every run of the tree has ended
  (`cancelled`), read from the store.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from keel import Agent, Limits, ScriptedTransport
from keel.messages import ModelRequest, ModelResponse
from keel.result import TERMINAL
from keel.store import RunStore, open_store
from keel.tools.base import make_tool

__all__ = ["Trial", "cancel_trials"]


@dataclass
class Sent:
    """When each model call of the tree was sent (every transport of the tree logs here)."""

    at: list[float] = field(default_factory=list)


class Logged:
    """A scripted model whose every call is timed as it starts."""

    def __init__(self, inner: ScriptedTransport, sent: Sent) -> None:
        self.inner, self.sent, self.name = inner, sent, inner.name

    async def request(self, request: ModelRequest) -> ModelResponse:
        self.sent.at.append(time.time())
        return await self.inner.request(request)


def _model(turns: list[dict[str, Any]], delay_ms: float, sent: Sent) -> Any:
    script = {"turns": turns, "latency_ms": delay_ms, "on_synthesis": {"text": "partial"}}
    return Logged(ScriptedTransport.from_dict(script), sent)


def _tree(store: str | Path, width: int, delay_ms: float, sent: Sent) -> Agent:
    def note(n: int) -> str:
        """Note a number."""
        return f"noted {n}"

    work = [{"tool_calls": [{"name": "note", "arguments": {"n": k}}]} for k in range(400)]
    many = Limits(max_model_calls=None, max_tool_calls=None, max_children=8)
    leaf = Agent(_model(work, delay_ms, sent), tools=[make_tool(note)], limits=many)
    fan = {"tool_calls": [{"name": "leaf", "arguments": {"task": f"p{n}"}} for n in range(width)]}
    middle = Agent(
        _model([{"repeat": 50, "turn": fan}], delay_ms, sent),
        tools=[leaf.as_tool("leaf", "Works")],
        limits=many,
    )
    top = {"tool_calls": [{"name": "middle", "arguments": {"task": f"h{n}"}} for n in range(width)]}
    return Agent(
        _model([top, {"text": "done"}], delay_ms, sent),
        tools=[middle.as_tool("middle", "Splits")],
        store=store,
        limits=many,
    )


@dataclass
class Trial:
    at: float
    """Seconds after the start the cancel was recorded."""
    open_runs: int
    after: int
    """Model calls started after the cancel was recorded."""
    quiet_ms: float
    all_cancelled: bool


def _descendants(store: RunStore, root: str) -> list[str]:
    runs = store.list_runs(10_000)
    found, todo = [], [root]
    while todo:
        run_id = todo.pop()
        found.append(run_id)
        todo += [r.run_id for r in runs if r.config.parent_run == run_id]
    return found


def one_trial(store_at: str | Path, width: int, delay_ms: float, wait: float) -> Trial:
    sent = Sent()
    lead = _tree(store_at, width, delay_ms, sent)
    holder: dict[str, Any] = {}

    async def drive() -> None:
        handle = lead.start("Work through the parts.")
        holder["run_id"] = handle.run_id
        holder["result"] = await handle

    runner = threading.Thread(target=asyncio.run, args=(drive(),))
    other = open_store(store_at)
    with lead:
        started = time.time()
        runner.start()
        time.sleep(wait)
        asked = other.request_cancel(holder["run_id"])
        recorded = time.time()
        while True:  # until every run of the tree has ended, as the store says
            tree = [other.get_run(r) for r in _descendants(other, holder["run_id"])]
            if all(r is not None and r.status in TERMINAL for r in tree):
                break
            time.sleep(0.005)
        quiet = time.time() - recorded
        runner.join(60)
    other.close()
    after = sum(1 for at in sent.at if at > recorded)
    statuses = {r.status for r in tree if r is not None}
    return Trial(recorded - started, len(asked), after, quiet * 1000, statuses == {"cancelled"})


def cancel_trials(store_for: Any, trials: int, width: int, delay_ms: float) -> list[Trial]:
    """`trials` trees, each cancelled at a random moment between 0.2 s and 2 s in."""
    rng = random.Random(49)
    return [
        one_trial(store_for(n), width, delay_ms, rng.uniform(0.2, 2.0)) for n in range(trials)
    ]


def summary(name: str, found: list[Trial]) -> str:
    over = max(t.after - t.open_runs for t in found)
    quiet = [t.quiet_ms for t in found]
    return (
        f"{name:>9} {len(found):>6} {statistics.median(t.open_runs for t in found):>9.0f} "
        f"{sum(t.after for t in found):>11} {over:>+13} "
        f"{statistics.median(quiet):>11.0f} {max(quiet):>8.0f} "
        f"{sum(t.all_cancelled for t in found):>9}"
    )


HEADER = (
    f"{'store':>9} {'trials':>6} {'open runs':>9} {'calls after':>11} {'after - open':>13} "
    f"{'quiet ms p50':>11} {'max ms':>8} {'all cancelled':>9}"
)
