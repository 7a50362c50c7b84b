"""Many machines: the Postgres store's cost per step, and runs per second with more workers.

Starts its own throwaway PostgreSQL cluster (`tests/postgres.py`: initdb in a temporary folder,
a free loopback port), with fsync and synchronous_commit ON, so a commit is as durable as a
production server's; stops it at the end.

1. Per-step overhead, Postgres vs SQLite: one in-process run of N=300 turns whose tool returns
   20 KB (a zero-latency scripted model, a free tool), ms per step on each store (median of
   repeats) and the difference. Target: Postgres adds at most 2 ms per step.
2. Throughput: 200 submitted runs of 10 turns (scripted model, 50 ms per call), taken by 1, 2
   and 4 `keel worker` processes of `--concurrency 20`. Reported: wall time from the first
   run's start to the last run's end (from the event log, so process start-up is not counted)
   and runs per second. Target: 2 workers take at most 0.6x the time of 1.

`--quick`: 1 repeat and 100 runs. `--check`: exit 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

try:
    import keel
except ModuleNotFoundError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    import keel

from checkpoint import agent as chunk_agent  # the per-step run, beside this file

from keel.agent import new_run_id
from keel.assemble import build_agent
from keel.limits import Limits
from keel.pool.dispatch import Dispatch
from keel.records import JsonObject
from keel.store.postgres_store import PostgresStore

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from postgres import Cluster, start_cluster, stop_cluster


async def per_step(target: str | Path, turns: int) -> float:
    store = keel.open_store(target)
    try:
        runner = chunk_agent(store, turns, 20)
        started = time.perf_counter()
        result = await runner.arun("Read the chunks.")
        assert result.status == "completed", result
        return (time.perf_counter() - started) * 1000 / turns
    finally:
        store.close()


def overhead(cluster: Cluster, repeats: int, turns: int = 300) -> tuple[float, float]:
    sqlite, postgres = [], []
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(per_step(Path(tmp) / "warm.sqlite", 10))
        for i in range(repeats):
            sqlite.append(asyncio.run(per_step(Path(tmp) / f"r{i}.sqlite", turns)))
            postgres.append(asyncio.run(per_step(cluster.url(cluster.create_database()), turns)))
    return statistics.median(sqlite), statistics.median(postgres)


def submit(url: str, folder: Path, runs: int) -> None:
    repo = folder / "repo"
    repo.mkdir(exist_ok=True)
    (repo / "notes.md").write_text("".join(f"line {i}\n" for i in range(20)))
    script = folder / "script.json"
    turns = [
        {"tool_calls": [{"name": "read_file", "arguments": {"path": "notes.md", "start_line": i}}]}
        for i in range(1, 10)
    ]
    script.write_text(json.dumps({"turns": [*turns, {"text": "done"}], "latency_ms": 50}))
    store = PostgresStore(url)
    dispatch = Dispatch(store)
    settings: JsonObject = {"repo": str(repo), "allow_hosts": []}
    try:
        agent = build_agent(f"script:{script}", settings, Limits(), store, None)
        for n in range(runs):
            dispatch.submit(new_run_id(), f"Run {n}?", agent.transport.name, agent.config())
    finally:
        dispatch.close()
        store.close()


def throughput(cluster: Cluster, workers: int, runs: int) -> tuple[float, float]:
    """(seconds from the first run's start to the last run's end, wall seconds with start-up)."""
    url = cluster.url(cluster.create_database())
    with tempfile.TemporaryDirectory() as tmp:
        submit(url, Path(tmp), runs)
        begun = time.monotonic()
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "keel",
                    "worker",
                    "--store",
                    url,
                    "--concurrency",
                    "20",
                    "--name",
                    f"bench{n}",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=dict(os.environ),
            )
            for n in range(workers)
        ]
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                while True:
                    (done,) = conn.execute(  # type: ignore[misc]
                        "SELECT count(*) FROM keel.runs WHERE status = 'completed'"
                    ).fetchone()
                    if done >= runs:
                        break
                    time.sleep(0.1)
                wall = time.monotonic() - begun
                first, last = conn.execute(  # type: ignore[misc]
                    "SELECT min(at) FILTER (WHERE type = 'run_started'),"
                    " max(at) FILTER (WHERE type = 'run_completed') FROM keel.events"
                ).fetchone()
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(timeout=60)
    return last - first, wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args()
    repeats, runs = (1, 100) if args.quick else (3, 200)
    cluster = start_cluster(fsync=True)
    try:
        sqlite, postgres = overhead(cluster, repeats)
        print(
            f"per step, 300 turns of 20 KB: SQLite {sqlite:.2f} ms, Postgres {postgres:.2f} ms,"
            f" difference {postgres - sqlite:+.2f} ms (target <= +2.00)"
        )
        times = {}
        for workers in (1, 2, 4):
            busy, wall = throughput(cluster, workers, runs)
            times[workers] = busy
            print(
                f"{workers} worker(s) x concurrency 20, {runs} runs of 10 turns at 50 ms: "
                f"{busy:.1f} s ({runs / busy:.1f} runs/s); {wall:.1f} s with start-up"
            )
        ratio = times[2] / times[1]
        print(f"2 workers / 1 worker: {ratio:.2f}x the time (target <= 0.60)")
    finally:
        stop_cluster(cluster)
    missed = postgres - sqlite > 2.0 or ratio > 0.6
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
