"""The embedded models on `keel eval --suite repo-questions-20` (issue 39, ADR 0054).

Each question of the suite is run as `keel eval --suite repo-questions-20 --model local:SIZE`
runs it (the scenario's limits: eight model calls, the first one a tool call; graded against
the code), one model after the other on the same question, so that a time budget cut short
leaves paired figures. Per run it records the grade (right / wrong / cut off), tool calls,
whether the answer was synthesized, the run's wall time, and the time to first token of its
first model call (the prompt's evaluation, from llama.cpp's own timing in the transport's
`Generation`). `--no-steering` builds the transports with ``steering=False`` (no first call
named by `keel.transports.local.steering`).

    python benchmarks/repo_questions_20.py --models 0.5b 1.5b --stop-at 16:05 --out r.json

Runs are sequential (one CPU budget); figures depend on the machine's other load, which the
output records (load average before and after).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

try:
    import keel  # noqa: F401
except ModuleNotFoundError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from keel.evals.loading import resolve
from keel.evals.runner import run_once
from keel.store.sqlite_store import Store
from keel.transports.local import Generation, LocalTransport

ROOT = Path(__file__).resolve().parents[1]


def instrumented(size: str, steering: bool) -> tuple[LocalTransport, list[Generation]]:
    """The transport `--model local:SIZE` builds, its generations recorded."""
    transport = LocalTransport(model=size, steering=steering)
    seen: list[Generation] = []
    generate = transport.generate

    def recording(*args: Any, **kwargs: Any) -> Generation:
        generation = generate(*args, **kwargs)
        seen.append(generation)
        return generation

    transport.generate = recording  # type: ignore[method-assign]
    return transport, seen


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    scenarios = resolve(args.only, "repo-questions-20")
    stop = None
    if args.stop_at:
        hour, minute = map(int, args.stop_at.split(":"))
        now = dt.datetime.now(dt.UTC)
        stop = now.replace(hour=hour, minute=minute, second=0, microsecond=0)
    transports = {size: instrumented(size, not args.no_steering) for size in args.models}
    rows: list[dict[str, Any]] = []
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="keel-rq20-") as folder:
        store = Store(Path(folder) / "runs.sqlite")
        for scenario in scenarios:
            if stop is not None and dt.datetime.now(dt.UTC) >= stop:
                print(f"stopped at --stop-at {args.stop_at}: {scenario.name} and later not run")
                break
            for size, (transport, seen) in transports.items():
                before = len(seen)
                started = time.perf_counter()
                row = await run_once(
                    scenario, model=f"local:{size}", store=store, repo=ROOT, shared=transport
                )
                wall = time.perf_counter() - started
                generations = seen[before:]
                record = {
                    "model": size,
                    "scenario": scenario.name,
                    "grade": row.grade,
                    "actual": row.actual,
                    "model_calls": row.model_calls,
                    "tool_calls": row.tool_calls,
                    "synthesized": row.synthesized,
                    "seconds": round(wall, 1),
                    "first_token_seconds": (
                        round(generations[0].prompt_seconds, 1) if generations else None
                    ),
                    "output_tokens": sum(g.output_tokens for g in generations),
                    "calls": row.calls,
                    "answer": row.answer,
                    "problems": row.problems,
                }
                rows.append(record)
                print(json.dumps({k: v for k, v in record.items() if k != "answer"}), flush=True)
                if args.out:
                    Path(args.out).write_text(json.dumps({"rows": rows}, indent=1))
        for transport, _ in transports.values():
            transport.close()
    return {
        "steering": not args.no_steering,
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "load_seconds": {s: t.load_seconds for s, (t, _) in transports.items()},
        "rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["0.5b", "1.5b"])
    parser.add_argument("--only", nargs="*", default=[], help="scenario names (default: all)")
    parser.add_argument("--no-steering", action="store_true")
    parser.add_argument("--stop-at", help="UTC HH:MM: start no question after it")
    parser.add_argument("--out", help="write the rows here as JSON (after every run)")
    args = parser.parse_args()
    result = asyncio.run(measure(args))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
