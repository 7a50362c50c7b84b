"""How fast `keel replay` plays recorded runs through the real run loop.

Replays the shared corpora (`../shared/trajectories`, 948 runs, ~28,000 calls) under both loop
policies and prints, per policy: runs, recorded calls, wall seconds, and microseconds per
recorded call. Each recording is played twice (as Keel runs it, and with the hard limit
alone), so a call costs two passes through the loop at most. One process, one core.

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
from keel.replay.recordings import Skipped, read_file

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
    for item in skipped:
        print(f"skipped {item.where}: {item.reason}", file=sys.stderr)


if __name__ == "__main__":
    given = [Path(arg) for arg in sys.argv[1:]] or CORPORA
    if not given:
        sys.exit("no recorded runs: give files, or put the shared corpora beside the checkout")
    asyncio.run(main(given))
