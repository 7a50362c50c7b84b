"""What a durable checkpoint costs per step, and whether that cost grows with the run.

Every step of a Keel run is saved in one SQLite transaction (WAL, synchronous=NORMAL) holding
only what the step added. This measures, for runs of 10, 100 and 300 turns whose tool results
are 1 KB or 20 KB (a zero-latency scripted model, a free in-process tool):

  ms/step        wall time of the run / steps (median of repeats), a checkpoint every step
  payload B/step bytes handed to SQLite by a step's checkpoint (median; event JSON, result
                 text, state row, changed counters): must not grow with the run's length
  disk B/step    bytes this process wrote to storage per step (/proc/self/io write_bytes:
                 WAL frames and checkpoints, page-granular), where the kernel reports it
  store/results  size of the store file(s) for the run over the bytes of results it holds

Targets (issue 3): <= 1.0 ms/step at 300 turns of 20 KB; the 300-turn figure <= 1.2x the
10-turn one; store size <= 1.2x the result bytes it holds. `--check` exits 1 on a miss.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path

try:
    import keel
except ModuleNotFoundError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    import keel

from keel.records import encode_event
from keel.store import sqlite_store

TURNS = (10, 100, 300)
SIZES_KB = (1, 20)


def disk_writes() -> int | None:
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("write_bytes:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


class PayloadMeter:
    """Counts the bytes each checkpoint hands to SQLite, by wrapping the group writer."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        """Payload bytes of each checkpoint, in order."""
        self._original = sqlite_store._write_checkpoints

        def metered(conn: object, cps: list[sqlite_store.Checkpoint]) -> None:
            for cp in cps:
                size = len(sqlite_store._dumps(cp.state.encode()))
                for event in cp.events:
                    _, data, body = encode_event(event)
                    size += len(sqlite_store._dumps(data)) + len(body or "")
                size += sum(len(k) + 24 for k in cp.counters)
                size += sum(len(d) + len(t) for d, t in cp.blobs)
                self.sizes.append(size)
            self._original(conn, cps)  # type: ignore[arg-type]

        sqlite_store._write_checkpoints = metered  # type: ignore[assignment]

    def restore(self) -> None:
        """Stores opened from now on write without the meter."""
        sqlite_store._write_checkpoints = self._original


def agent(store: keel.RunStore, turns: int, size_kb: int) -> keel.Agent:
    """A zero-latency scripted run of `turns` model calls, each but the last asking a free
    tool for `size_kb` KB (also `pool.py`'s per-step run, on either store)."""
    payload = ("Lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 400)[: size_kb * 1024]

    @keel.tool
    async def read_chunk(n: int) -> str:
        """Return chunk n."""
        # each chunk its own, as a real file's are: the repeat tiers see no loop
        return f"{n:08d}{payload[8:]}"

    script = {
        "turns": [
            {"tool_calls": [{"name": "read_chunk", "arguments": {"n": i}}]}
            for i in range(turns - 1)
        ]
        + [{"text": "done"}],
    }
    return keel.Agent(
        keel.ScriptedTransport.from_dict(script),
        tools=[read_chunk],
        limits=keel.Limits(max_model_calls=turns + 5, max_tool_calls=turns + 5),
        store=store,
    )


async def measure(folder: Path, turns: int, size_kb: int, repeats: int) -> dict[str, float]:
    times, payloads, disks, ratios = [], [], [], []
    for i in range(repeats):
        path = folder / f"run-{turns}-{size_kb}-{i}.sqlite"
        meter = PayloadMeter()  # before the store, whose worker takes the writer at start
        store = keel.Store(path)
        try:
            runner = agent(store, turns, size_kb)
            gc.collect()
            written = disk_writes()
            started = time.perf_counter()
            result = await runner.arun("Read the chunks.")
            times.append((time.perf_counter() - started) * 1000 / turns)
            after = disk_writes()
            if written is not None and after is not None:
                disks.append((after - written) / turns)
            payloads.append(statistics.median(meter.sizes))  # a step's checkpoint, typically
            assert result.status == "completed", result
        finally:
            meter.restore()
            store.close()
        held = (turns - 1) * size_kb * 1024
        size = sum(p.stat().st_size for p in folder.glob(path.name + "*"))
        ratios.append(size / held)
    return {
        "ms": statistics.median(times),
        "payload": statistics.median(payloads),
        "disk": statistics.median(disks) if disks else float("nan"),
        "ratio": statistics.median(ratios),
    }


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args()
    rows: dict[tuple[int, int], dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        await measure(Path(tmp), 10, 1, 1)  # warm-up
        for size_kb in SIZES_KB:
            for turns in TURNS:
                rows[turns, size_kb] = await measure(Path(tmp), turns, size_kb, args.repeats)
    print(
        f"{'result':>7} {'turns':>6} {'ms/step':>8} {'payload B/step':>15} "
        f"{'disk B/step':>12} {'store/results':>14}"
    )
    for (turns, size_kb), r in rows.items():
        print(
            f"{size_kb:>5}KB {turns:>6} {r['ms']:>8.3f} {r['payload']:>15,.0f} "
            f"{r['disk']:>12,.0f} {r['ratio']:>14.2f}"
        )
    big = rows[300, 20]
    flat = big["ms"] / rows[10, 20]["ms"]
    payload_flat = big["payload"] / rows[10, 20]["payload"]
    checks = [
        ("ms/step at 300 x 20 KB <= 1.0", big["ms"] <= 1.0, f"{big['ms']:.3f}"),
        ("300-turn / 10-turn ms <= 1.2", flat <= 1.2, f"{flat:.2f}"),
        ("payload 300 / 10 turns <= 1.2", payload_flat <= 1.2, f"{payload_flat:.2f}"),
        ("store / results at 300 x 20 KB <= 1.2", big["ratio"] <= 1.2, f"{big['ratio']:.2f}"),
    ]
    print()
    for name, ok, value in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {value}")
    return 0 if all(ok for _, ok, _ in checks) or not args.check else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
