"""How fast `keel replay` plays recorded runs through the real run loop.

Replays the shared corpora (`../shared/trajectories`, 948 runs, ~28,000 calls) under both loop
policies and prints, per policy: runs, recorded calls, wall seconds, and microseconds per
recorded call. Each recording is played twice (as Keel runs it, and with the hard limit
alone), so a call costs two passes through the loop at most. One process, one core.

Then one made-up run of 5,000 and one of 20,000 turns (a distinct call each, so no rule stops
it): the time per turn must stay the same however long the run (ADR 0049; before, a request
copied the whole history each turn, and 60,000 turns cost 787 µs of CPU each against 487 µs
at 16,000).

    python benchmarks/replay.py [FILES...]
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

try:
    import keel  # noqa: F401
except ModuleNotFoundError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from rich.console import Console
from rich.table import Table

from keel.replay.playback import replay
from keel.replay.recordings import Recorded, Recording, Skipped, read_file

CORPORA = sorted((Path(__file__).resolve().parents[2] / "shared" / "trajectories").glob("*.gz"))


async def main(paths: list[Path]) -> None:
    skipped: list[Skipped] = []
    started = time.perf_counter()
    recordings = [r for path in paths for r in read_file(path, skipped)]
    loaded = time.perf_counter() - started
    calls = sum(len(turn) for r in recordings for turn in r.turns)
    grid = Table(title=f"keel replay: {len(recordings)} runs, {calls:,} calls")
    for header in ("policy", "load s", "replay s", "µs per call", "runs with a synthesis turn"):
        grid.add_column(header, justify="right")
    for policy in ("adr", "progress"):
        started = time.perf_counter()
        replayed = [await replay(r, policy=policy) for r in recordings]  # type: ignore[arg-type]
        seconds = time.perf_counter() - started
        synthesis = sum(item.synthesis_after is not None for item in replayed)
        per_call = f"{seconds / calls * 1e6:.0f}"
        grid.add_row(policy, f"{loaded:.2f}", f"{seconds:.2f}", per_call, str(synthesis))
    Console(width=120).print(grid)
    long = Table(title="keel replay: one long run")
    for header in ("turns", "CPU s", "µs per turn"):
        long.add_column(header, justify="right")
    for turns in (5_000, 20_000):
        recording = _long(turns)
        started = time.process_time()
        await replay(recording)
        seconds = time.process_time() - started
        long.add_row(f"{turns:,}", f"{seconds:.2f}", f"{seconds / turns * 1e6:.0f}")
    Console(width=120).print(long)
    for item in skipped:
        print(f"skipped {item.where}: {item.reason}", file=sys.stderr)


def _long(turns: int) -> Recording:
    calls = (Recorded("bash", {"command": f"ls {n}"}, f"{n:016x}", "read") for n in range(turns))
    return Recording(id=f"long-{turns}", turns=tuple((call,) for call in calls))


if __name__ == "__main__":
    given = [Path(arg) for arg in sys.argv[1:]] or CORPORA
    if not given:
        sys.exit("no recorded runs: give files, or put the shared corpora beside the checkout")
    asyncio.run(main(given))
