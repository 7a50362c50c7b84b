"""Keel's own overhead per turn: everything the runtime does around a model call and a tool call.

What is measured
  1. Per turn, log ON. A scripted model with zero latency asks for one cheap in-process
     read_only tool per turn (a counter argument, so no two calls are identical and the breaker
     never fires); the last turn answers in text. The tool returns a precomputed 1 KB or 20 KB
     string, so its own cost is ~0. Every run writes its event log to a real SQLite store in a
     temporary folder. The context budget is the default (100k tokens), so long 20 KB runs elide
     old results, as real runs do.
       ms/turn  = wall time of `agent.arun` (run row to final checkpoint) / model calls; median
                  of the runs (best and mean shown too). Fixed per-run costs are included.
       mean     = all runs' time / all their turns: rare stalls (SQLite WAL checkpoints) count
                  in full, where a median of short runs mostly skips them.
       marginal = (t300 - t10) / 290: the cost of one more turn, fixed costs cancelled out.
       300/10   = ms/turn at 300 turns over ms/turn at 10 turns; ~1.0 when history is free.
  2. Concurrency. N runs (default 200) of 10 turns at once, one shared store, a scripted model
     with 50 ms latency. Ideal wall time: 10 x 50 ms = 0.5 s; overhead per model call =
     (wall - ideal) / (N x 10): how much the runtime delays runs that share one event loop.

Targets (the issue): <= 1.0 ms/turn at 300 turns of 20 KB; 300/10 ratio <= 1.2; concurrency
overhead <= 0.3 ms per model call. PASS/FAIL is printed; the exit status is 1 on FAIL only with
`--check`. `--profile` adds a cProfile of one 300-turn 20 KB run (top keel functions).
Timings depend on the machine and its other load: compare figures from the same machine.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import pstats
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

try:
    import keel
except ModuleNotFoundError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    import keel

from rich.console import Console
from rich.table import Table

QUESTION = "Benchmark: read the chunks, then answer."
TURN_COUNTS = (10, 100, 300)
SIZES_KB = (1, 20)
TARGET_MS_PER_TURN = 1.0  # at 300 turns of 20 KB
TARGET_RATIO = 1.2  # 300-turn over 10-turn ms/turn
TARGET_CONCURRENT_MS = 0.3  # per model call, 200 runs at 50 ms latency
LATENCY_MS = 50.0
CONCURRENT_TURNS = 10

console = Console(width=None if sys.stdout.isatty() else 120)


def chunk_tool(size_kb: int) -> keel.Tool:
    payload = ("Lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 400)[: size_kb * 1024]

    @keel.tool(effect="read_only")
    async def read_chunk(n: int) -> str:
        """Return chunk number n of the benchmark corpus."""
        # each chunk its own, as a real file's are: the repeat tiers see no loop
        return f"{n:08d}{payload[8:]}"

    return read_chunk


def make_agent(store: keel.Store, turns: int, size_kb: int, latency_ms: float = 0.0) -> keel.Agent:
    script = {
        "turns": [
            {"tool_calls": [{"name": "read_chunk", "arguments": {"n": i}}]}
            for i in range(turns - 1)
        ]
        + [{"text": "The chunks say lorem ipsum."}],
        "latency_ms": latency_ms,
    }
    transport = keel.ScriptedTransport.from_dict(script, f"bench-{turns}x{size_kb}k")
    limits = keel.Limits(max_model_calls=turns + 10, max_tool_calls=turns + 10)
    return keel.Agent(transport, tools=[chunk_tool(size_kb)], limits=limits, store=store)


def check(result: keel.RunResult, turns: int) -> None:
    if result.status != "completed" or result.synthesized is not None:
        raise SystemExit(f"benchmark run did not complete plainly: {result}")
    if result.model_calls != turns or result.tool_calls != turns - 1:
        raise SystemExit(f"expected {turns} model calls, got {result.model_calls}: {result}")


async def timed_run(store: keel.Store, turns: int, size_kb: int) -> tuple[float, str]:
    agent = make_agent(store, turns, size_kb)  # script validation stays outside the timing
    gc.collect()
    started = time.perf_counter()
    result = await agent.arun(QUESTION)
    elapsed = time.perf_counter() - started
    check(result, turns)
    return elapsed, result.run_id


@dataclass
class Case:
    turns: int
    size_kb: int
    times: list[float]  # wall seconds of each run
    elided: int

    @property
    def seconds(self) -> float:
        return statistics.median(self.times)

    @property
    def ms_per_turn(self) -> float:
        return self.seconds * 1000 / self.turns

    @property
    def mean_ms(self) -> float:
        """All runs' time over all their turns: rare stalls (WAL checkpoints) count in full."""
        return statistics.fmean(self.times) * 1000 / self.turns


async def per_turn(store: keel.Store, repeats: int) -> list[Case]:
    await timed_run(store, 10, 1)  # warm-up: imports, pydantic schemas, SQLite pages
    cases = []
    for size_kb in SIZES_KB:
        for turns in TURN_COUNTS:
            # short runs are repeated until they cover about as many turns as one long run
            n = max(repeats, 300 // turns) if turns < 300 else max(1, min(repeats, 3))
            runs = [await timed_run(store, turns, size_kb) for _ in range(n)]
            times, run_id = [seconds for seconds, _ in runs], runs[-1][1]
            elided = sum(e.type == "result_elided" for e in store.events(run_id))
            cases.append(Case(turns, size_kb, times, elided))
    return cases


async def concurrent(store: keel.Store, runs: int) -> float:
    agents = [make_agent(store, CONCURRENT_TURNS, 1, LATENCY_MS) for _ in range(runs)]
    gc.collect()
    started = time.perf_counter()
    results = await asyncio.gather(*(agent.arun(QUESTION) for agent in agents))
    elapsed = time.perf_counter() - started
    for result in results:
        check(result, CONCURRENT_TURNS)
    return elapsed


def verdict(ok: bool) -> str:
    return "[green]PASS[/green]" if ok else "[red]FAIL[/red]"


def report_per_turn(cases: list[Case]) -> bool:
    table = Table(title="1. Per-turn overhead, zero-latency model, SQLite event log ON")
    for col in (
        "result",
        "turns",
        "runs",
        "run wall ms (median)",
        "ms/turn (median)",
        "ms/turn (best)",
        "ms/turn (mean)",
        "results elided",
    ):
        table.add_column(col, justify="right")
    for c in cases:
        table.add_row(
            f"{c.size_kb} KB",
            str(c.turns),
            str(len(c.times)),
            f"{c.seconds * 1000:.1f}",
            f"{c.ms_per_turn:.3f}",
            f"{min(c.times) * 1000 / c.turns:.3f}",
            f"{c.mean_ms:.3f}",
            str(c.elided),
        )
    console.print(table)
    summary = Table(title="Per-turn summary (ms/turn = run wall / model calls, median)")
    for col in (
        "result",
        "ms/turn @300",
        "marginal (t300-t10)/290",
        "300/10 ratio",
        "300/10 (means)",
        "target",
        "verdict",
    ):
        summary.add_column(col, justify="right")
    ok_all = True
    for size_kb in SIZES_KB:
        by_turns = {c.turns: c for c in cases if c.size_kb == size_kb}
        first, last = by_turns[TURN_COUNTS[0]], by_turns[TURN_COUNTS[-1]]
        marginal = (last.seconds - first.seconds) * 1000 / (last.turns - first.turns)
        ratio = last.ms_per_turn / first.ms_per_turn
        ok = last.ms_per_turn <= TARGET_MS_PER_TURN and ratio <= TARGET_RATIO
        ok_all &= ok
        summary.add_row(
            f"{size_kb} KB",
            f"{last.ms_per_turn:.3f}",
            f"{marginal:.3f}",
            f"{ratio:.2f}",
            f"{last.mean_ms / first.mean_ms:.2f}",
            f"<= {TARGET_MS_PER_TURN} ms, <= {TARGET_RATIO}x",
            verdict(ok),
        )
    console.print(summary)
    return ok_all


def report_concurrent(walls: list[float], runs: int) -> bool:
    ideal = CONCURRENT_TURNS * LATENCY_MS / 1000
    wall = statistics.median(walls)
    per_call = (wall - ideal) * 1000 / (runs * CONCURRENT_TURNS)
    table = Table(
        title=f"2. Concurrency: {runs} runs x {CONCURRENT_TURNS} turns, "
        f"{LATENCY_MS:g} ms model latency, one shared store"
    )
    for col in (
        "wall (s, median)",
        "all walls (s)",
        "ideal (s)",
        "model calls",
        "overhead ms/call",
        "target",
        "verdict",
    ):
        table.add_column(col, justify="right")
    ok = per_call <= TARGET_CONCURRENT_MS
    table.add_row(
        f"{wall:.3f}",
        " ".join(f"{w:.3f}" for w in walls),
        f"{ideal:.3f}",
        str(runs * CONCURRENT_TURNS),
        f"{per_call:.3f}",
        f"<= {TARGET_CONCURRENT_MS}",
        verdict(ok),
    )
    console.print(table)
    return ok


async def run_profile(store: keel.Store, top: int) -> None:
    agent = make_agent(store, 300, 20)
    profiler = cProfile.Profile()
    profiler.enable()
    result = await agent.arun(QUESTION)
    profiler.disable()
    check(result, 300)
    stats = pstats.Stats(profiler)
    total = sum(row[2] for row in stats.stats.values())  # type: ignore[attr-defined]
    polling = sum(
        row[2]
        for (_, _, name), row in stats.stats.items()  # type: ignore[attr-defined]
        if "select." in name
    )  # epoll/kqueue/select: the loop waiting for the store
    console.print(
        f"\n[bold]Profile[/bold]: main thread {total * 1000:.0f} ms, of which "
        f"{polling * 1000:.0f} ms idle in the event loop's poll, i.e. waiting for the "
        "store's worker thread (the model and the tool take no time here)"
    )
    for sort in ("cumulative", "tottime"):
        console.print(
            f"\n[bold]Profile, one 300-turn 20 KB run: top {top} keel functions "
            f"by {sort}[/bold] (the store's worker thread is not profiled)"
        )
        stats.sort_stats(sort).print_stats(r"[/\\]keel[/\\]", top)


async def main(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="keel-bench-") as folder:
        store = keel.Store(Path(folder) / "bench.sqlite")
        try:
            cases = await per_turn(store, args.repeats)
            ok = report_per_turn(cases)
            await concurrent(store, min(args.runs, 20))  # warm-up
            walls = [await concurrent(store, args.runs) for _ in range(args.concurrency_repeats)]
            ok &= report_concurrent(walls, args.runs)
            if args.profile:
                await run_profile(store, args.top)
        finally:
            store.close()
    console.print(f"Overall: {verdict(ok)}")
    return 1 if args.check and not ok else 0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats (a rough figure)")
    parser.add_argument("--repeats", type=int, default=5, help="repeats per case (median)")
    parser.add_argument("--runs", type=int, default=200, help="concurrent runs")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument("--profile", action="store_true", help="cProfile a 300-turn 20 KB run")
    parser.add_argument("--top", type=int, default=15, help="functions shown by --profile")
    args = parser.parse_args()
    args.concurrency_repeats = 3
    if args.quick:
        args.repeats, args.concurrency_repeats = 2, 1
    return args


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
