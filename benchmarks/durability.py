"""What durability costs: fsyncs per step, milliseconds per step on a real disk and a RAM disk
beside the floor, and the runtime's overhead with many runs sharing one store.

1. fsyncs per step, counted with strace (`strace -f`, every fsync and fdatasync with its thread):
   runs of N = 10, 100, 300 and 1,000 turns (20 KB results, a zero-latency scripted model, one
   read_only tool), and 20 runs of 100 turns sharing one store, at both durability levels.
     commit path  fsyncs on the store's thread, which every step waits for; "max/commit" is
                  the most any single commit issued (the writer stats the store file once per
                  commit, which splits the trace into commits)
     keeper       fsyncs of the WAL keeper's thread (checkpoints, log restarts): nobody waits
     per step     all of the process's fsyncs between the markers / steps
   Without strace this table is skipped with a message (Debian: apt-get install strace).
2. ms per step, N=300 turns of 20 KB at durability=power, on the real disk (a folder under
   --disk, default the system's temporary folder) and on a RAM disk (/dev/shm), beside
     floor        a raw SQLite insert + commit of the same bytes per step (WAL, synchronous
                  FULL): the disk's own cost of one durable step
     no store     the same run loop with no store at all
   Median and best of --repeats runs, in wall time and in CPU time (all of the process's
   threads; it moves much less than wall time when other work shares the machine). Target on the
   RAM disk (issue 12): <= 0.25 ms per step, within 2x of no-store + floor.
3. Concurrency: 200 runs x 10 turns at 50 ms model latency sharing one store (the measurement
   of `overhead.py`): the runtime's overhead per model call. Target: <= 0.1 ms.

`--quick` for fewer repeats; `--check` exits 1 when a target is missed. Figures depend on the
machine and on what else it is doing: compare figures taken on one machine, at one time.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

try:
    import keel
except ModuleNotFoundError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    import keel

import overhead  # the concurrency measurement, beside this file
from checkpoint import PayloadMeter

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from fsyncs import STRACE, trace_runs
from keel._run.loop import RunLoop
from keel.agent import new_run_id

QUESTION = "Read the chunks."
TEXT = ("Lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 400)[: 20 * 1024]
FSYNC_CASES = ((1, 10), (1, 100), (1, 300), (1, 1000), (20, 100))
TARGET_RAM_MS = 0.25
TARGET_CONCURRENT_MS = 0.1


@keel.tool(effect="read_only")
async def read_chunk(n: int) -> str:
    """Return chunk number n of the corpus."""
    # each chunk its own, as a real file's are: the repeat tiers see no loop
    return f"{n:08d}{TEXT[8:]}"


def make_agent(store: keel.Store | None, turns: int) -> keel.Agent:
    script = {
        "turns": [
            {"tool_calls": [{"name": "read_chunk", "arguments": {"n": i}}]}
            for i in range(turns - 1)
        ]
        + [{"text": "The chunks say lorem ipsum."}]
    }
    limits = keel.Limits(max_model_calls=turns + 5, max_tool_calls=turns + 5)
    transport = keel.ScriptedTransport.from_dict(script)
    return keel.Agent(transport, tools=[read_chunk], limits=limits, store=store)


# -- 1. fsyncs per step ------------------------------------------------------------------------


def fsyncs(folder: Path, durability: str, runs: int, turns: int) -> dict[str, Any]:
    """One traced case (`tests/fsyncs.py`: the runs under strace, split into commits)."""
    case = folder / f"fsync-{durability}-{runs}-{turns}"
    case.mkdir()
    trace = trace_runs(case, durability, runs, turns)
    steps = runs * turns
    path = sum(trace.worker)
    return {
        "durability": durability,
        "case": f"{runs} x {turns}",
        "steps": steps,
        "commits": trace.commits,
        "path": path,
        "max": max(trace.worker, default=0),
        "keeper": trace.keeper + trace.other,
        "per_step": trace.total / steps,
        "path_per_step": path / steps,
    }


def report_fsyncs(folder: Path) -> bool:
    if STRACE is None:
        print("1. fsyncs per step: skipped, strace is not installed (apt-get install strace)")
        return True
    rows = [
        fsyncs(folder, durability, runs, turns)
        for durability in ("process", "power")
        for runs, turns in FSYNC_CASES
    ]
    print("1. fsyncs per step (strace), 20 KB results")
    print(
        f"{'durability':<11}{'runs x turns':>13}{'steps':>7}{'commits':>9}{'commit path':>13}"
        f"{'max/commit':>12}{'keeper':>8}{'path/step':>11}{'all/step':>10}"
    )
    ok = True
    for r in rows:
        print(
            f"{r['durability']:<11}{r['case']:>13}{r['steps']:>7}{r['commits']:>9}{r['path']:>13}"
            f"{r['max']:>12}{r['keeper']:>8}{r['path_per_step']:>11.3f}{r['per_step']:>10.3f}"
        )
        ok &= r["max"] <= 1 and r["path_per_step"] <= 1.0 + 2 / 10
        if r["durability"] == "process":
            ok &= r["per_step"] <= 0.1
    print(
        "   a run of N turns is N + 2 commits (its creation, one per turn, its end); at power "
        "each is one fsync,\n   so path/step is 1 + 2/N for one run and less when runs commit "
        "together\n"
    )
    return ok


# -- 2. ms per step ----------------------------------------------------------------------------


Times = tuple[list[float], list[float]]
"""Wall and CPU milliseconds per step, one of each per repeat."""


async def timed(folder: Path, durability: str, repeats: int, turns: int) -> Times:
    wall, cpu = [], []
    for i in range(repeats):
        store = keel.Store(folder / f"timed-{durability}-{i}.sqlite", durability=durability)  # type: ignore[arg-type]
        try:
            agent = make_agent(store, turns)
            gc.collect()
            started, used = time.perf_counter(), time.process_time()
            result = await agent.arun(QUESTION)
            wall.append((time.perf_counter() - started) * 1000 / turns)
            cpu.append((time.process_time() - used) * 1000 / turns)
            assert result.status == "completed", result
        finally:
            store.close()
    return wall, cpu


async def no_store(repeats: int, turns: int) -> Times:
    wall, cpu = [], []
    for _ in range(repeats):
        agent = make_agent(None, turns)
        setup = dataclasses.replace(agent._setup(), store=None)  # the same loop, nothing saved
        loop = RunLoop(new_run_id(), QUESTION, setup)
        gc.collect()
        started, used = time.perf_counter(), time.process_time()
        result = await loop.run()
        wall.append((time.perf_counter() - started) * 1000 / turns)
        cpu.append((time.process_time() - used) * 1000 / turns)
        assert result.status == "completed", result
        agent.close()
    return wall, cpu


async def step_bytes(folder: Path, turns: int) -> int:
    """Bytes a step hands to SQLite (median over a run), measured on Keel's own writer."""
    meter = PayloadMeter()
    store = keel.Store(folder / "metered.sqlite")
    try:
        await make_agent(store, turns).arun(QUESTION)
    finally:
        store.close()
        meter.restore()
    return int(statistics.median(meter.sizes))


def floor(folder: Path, size: int, steps: int, repeats: int) -> Times:
    """A raw SQLite insert + commit of `size` bytes per step, WAL, synchronous FULL, and no
    checkpoint during the loop: the least a durable step can cost on this disk."""
    wall, cpu = [], []
    for i in range(repeats):
        conn = sqlite3.connect(folder / f"floor-{i}.sqlite", isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA wal_autocheckpoint=0")
        conn.execute("CREATE TABLE steps (id INTEGER PRIMARY KEY, body TEXT)")
        data = "x" * size
        started, used = time.perf_counter(), time.process_time()
        for _ in range(steps):
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO steps (body) VALUES (?)", (data,))
            conn.execute("COMMIT")
        wall.append((time.perf_counter() - started) * 1000 / steps)
        cpu.append((time.process_time() - used) * 1000 / steps)
        conn.close()
    return wall, cpu


def cell(times: Times) -> str:
    wall, cpu = times
    return (
        f"{statistics.median(wall):>8.3f} {min(wall):>7.3f} "
        f"{statistics.median(cpu):>8.3f} {min(cpu):>7.3f}"
    )


async def report_ms(disk: Path, repeats: int) -> bool:
    turns = 300
    print(f"2. ms per step, {turns} turns of 20 KB, median and best of {repeats} runs")
    print(f"{'where':<30}{'what':<38}{'wall':>8} {'best':>7} {'cpu':>8} {'best':>7}")
    ok = True
    loop_only = await no_store(repeats, turns)
    places = [("real disk " + str(disk), disk)]
    if Path("/dev/shm").is_dir():
        places.append(("RAM disk /dev/shm", Path("/dev/shm")))
    for where, base in places:
        with tempfile.TemporaryDirectory(prefix="keel-bench-", dir=base) as tmp:
            folder = Path(tmp)
            size = await step_bytes(folder, 30)
            await timed(folder, "power", 1, 10)  # warm-up
            power = await timed(folder, "power", repeats, turns)
            process = await timed(folder, "process", repeats, turns)
            raw = floor(folder, size, turns, repeats)
        print(f"{where:<30}{'durability=power':<38}{cell(power)}")
        print(f"{'':<30}{'durability=process':<38}{cell(process)}")
        print(f"{'':<30}{f'floor: SQLite insert+commit {size:,} B':<38}{cell(raw)}")
        print(f"{'':<30}{'the loop with no store':<38}{cell(loop_only)}")
        if base == Path("/dev/shm"):
            bound = 2 * (statistics.median(loop_only[0]) + statistics.median(raw[0]))
            got = statistics.median(power[0])
            ok &= got <= TARGET_RAM_MS or got <= bound
            print(
                f"   RAM disk, power: {got:.3f} ms/step; target <= {TARGET_RAM_MS} ms or "
                f"<= 2 x (no store + floor) = {bound:.3f} ms"
            )
    print()
    return ok


# -- 3. concurrency ----------------------------------------------------------------------------


async def concurrent(store: keel.Store, runs: int) -> tuple[float, float]:
    """`overhead.concurrent`, also measuring the CPU time the runs took (all threads)."""
    agents = [
        overhead.make_agent(store, overhead.CONCURRENT_TURNS, 1, overhead.LATENCY_MS)
        for _ in range(runs)
    ]
    gc.collect()
    started, used = time.perf_counter(), time.process_time()
    results = await asyncio.gather(*(agent.arun(overhead.QUESTION) for agent in agents))
    wall, cpu = time.perf_counter() - started, time.process_time() - used
    for result in results:
        overhead.check(result, overhead.CONCURRENT_TURNS)
    return wall, cpu


async def report_concurrency(repeats: int) -> bool:
    runs = 200
    with tempfile.TemporaryDirectory(prefix="keel-bench-") as folder:
        store = keel.Store(Path(folder) / "shared.sqlite")
        try:
            await concurrent(store, 20)  # warm-up
            measured = [await concurrent(store, runs) for _ in range(repeats)]
        finally:
            store.close()
    ideal = overhead.CONCURRENT_TURNS * overhead.LATENCY_MS / 1000
    calls = runs * overhead.CONCURRENT_TURNS
    per_call = [(wall - ideal) * 1000 / calls for wall, _ in measured]
    cpu_per_call = [cpu * 1000 / calls for _, cpu in measured]
    print(
        f"3. concurrency: {runs} runs x {overhead.CONCURRENT_TURNS} turns at "
        f"{overhead.LATENCY_MS:g} ms latency, one shared store (process durability)"
    )
    walls = " ".join(f"{wall:.3f}" for wall, _ in measured)
    print(f"   walls (s): {walls}; ideal {ideal:.3f} s")
    print(
        f"   overhead per model call: median {statistics.median(per_call):.3f} ms, best "
        f"{min(per_call):.3f} ms (target <= {TARGET_CONCURRENT_MS} ms); CPU per model call "
        f"(all threads): median {statistics.median(cpu_per_call):.3f} ms\n"
    )
    return statistics.median(per_call) <= TARGET_CONCURRENT_MS


async def main(args: argparse.Namespace) -> int:
    repeats = 2 if args.quick else args.repeats
    with tempfile.TemporaryDirectory(prefix="keel-fsyncs-", dir=args.disk) as folder:
        ok = report_fsyncs(Path(folder))
    ok &= await report_ms(Path(args.disk or tempfile.gettempdir()), repeats)
    ok &= await report_concurrency(1 if args.quick else 3)
    print("all targets met" if ok else "a target was missed")
    return 1 if args.check and not ok else 0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument("--disk", help="a folder on the real disk [default: the temp folder]")
    return parser.parse_args()


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
