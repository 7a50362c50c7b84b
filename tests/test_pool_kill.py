"""The multi-worker kill test (ADR 0026): 3 `keel worker`s, 60 submitted scripted runs that each
read, then write once (pre-approved), and a killer that SIGKILLs a random worker at random
moments 20 times, starting a replacement each time. Every run must end completed with the
answer of an uninterrupted run; each side effect happened at most once (the files say so); and
the event log shows that no two workers ever advanced one run at once."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from keel.agent import new_run_id
from keel.assemble import build_agent
from keel.limits import Limits
from keel.pool.dispatch import Dispatch
from keel.records import JsonObject
from keel.store.postgres_store import PostgresStore
from pool import Pool, call

RUNS, WORKERS, KILLS = 60, 3, 20
ANSWER = "The notes say leases expire; the effect was logged once."


def script_for(n: int) -> dict[str, Any]:
    return {
        "turns": [
            {"tool_calls": [call("read_file", path="notes.md")]},
            {"tool_calls": [call("list_files")]},
            {
                "tool_calls": [
                    call("write_file", path=f"effects/r{n}.txt", content="done\n", append=True)
                ]
            },
            {"tool_calls": [call("read_file", path="notes.md", start_line=2)]},
            {"text": ANSWER},
        ],
        "latency_ms": 1200,
    }


@pytest.fixture
def pool(tmp_path: Path, pg_url: str) -> Iterator[Pool]:
    made = Pool(tmp_path, pg_url, script_for(0))
    (made.repo / "effects").mkdir()
    yield made
    made.stop_all()


def submit_all(pool: Pool, tmp_path: Path) -> dict[str, int]:
    """Submit the runs from this process (what `keel submit` does, 60 times, without paying a
    process start for each: `tests/test_pool.py` drives the command itself)."""
    store = PostgresStore(pool.url)
    dispatch = Dispatch(store)
    settings: JsonObject = {"repo": str(pool.repo), "allow_hosts": [], "allow_writes": True}
    runs = {}
    try:
        for n in range(RUNS):
            script = tmp_path / f"script{n}.json"
            script.write_text(json.dumps(script_for(n)))
            agent = build_agent(f"script:{script}", settings, Limits(), store, None,
                                  approve_tools=["write_file"])  # fmt: skip
            run_id = new_run_id()
            dispatch.submit(run_id, f"Run {n}: what do the notes say?", agent.transport.name,
                            agent.config())  # fmt: skip
            runs[run_id] = n
    finally:
        dispatch.close()
        store.close()
    return runs


class Killer(threading.Thread):
    """SIGKILLs a random working worker (one that has begun taking runs) at random moments,
    starting a replacement each time."""

    def __init__(self, pool: Pool, live: dict[str, subprocess.Popen[str]]) -> None:
        super().__init__(daemon=True)
        self.pool, self.live, self.kills = pool, live, 0
        self.rng = random.Random(13)
        self.done = threading.Event()

    def run(self) -> None:
        while self.kills < KILLS and not self.done.wait(self.rng.uniform(0.3, 2.0)):
            working = [name for name in self.live if "taking runs" in self.pool.log(name)]
            if not working:
                continue
            name = self.rng.choice(working)
            victim = self.live.pop(name)
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            self.kills += 1
            self.live[f"r{self.kills}"] = self.pool.worker(f"r{self.kills}", lease_ttl=2.0)


def no_two_holders_at_once(events: list[dict[str, Any]]) -> None:
    """From the event log: seq runs 0..n without gaps, and it is one holder after another: each
    holder's events come after the previous holder's last one (time never goes back)."""
    assert [e["seq"] for e in events] == list(range(len(events)))
    holders = [e["owner"] for e in events if e["type"] in ("run_started", "run_resumed")]
    assert events[0]["type"] == "run_started" and all(holders)
    times = [e["at"] for e in events]
    assert times == sorted(times), "events of two holders interleave"


def test_killing_workers_at_random_loses_no_run_and_repeats_no_side_effect(
    pool: Pool, tmp_path: Path
) -> None:
    runs = submit_all(pool, tmp_path)
    live = {f"w{n}": pool.worker(f"w{n}", lease_ttl=2.0) for n in range(WORKERS)}
    killer = Killer(pool, live)
    killer.start()
    try:
        pool.wait_for(list(runs), {"completed"}, timeout=600)
    finally:
        killer.done.set()
        killer.join()
    assert killer.kills == KILLS, f"only {killer.kills} kills before the runs were done"
    taken_over = 0
    for run_id, n in runs.items():
        shown = pool.show(run_id)
        assert shown["run"]["answer"] == ANSWER and shown["run"]["tool_calls"] == 4
        no_two_holders_at_once(shown["events"])
        taken_over += sum(e["type"] == "run_resumed" for e in shown["events"])
        effect = pool.repo / "effects" / f"r{n}.txt"
        lines = effect.read_text().splitlines() if effect.exists() else []
        assert len(lines) <= 1, f"run {n}'s side effect ran {len(lines)} times"
    assert taken_over > 0, "no run was ever taken over: the kills proved nothing"
