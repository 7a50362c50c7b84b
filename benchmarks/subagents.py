"""Sub-agents: what a delegation costs against a plain tool call (ADR 0046).

A lead agent (a zero-latency scripted model) asks in one turn for N calls, then answers. In one
case each call is a plain async tool that returns a line of text; in the other each is a
delegation to a child agent (also scripted, zero latency) that answers the task in one turn.
Both run on a SQLite store in a temporary folder, with `max_children` = N so all run at once.
Reported: the lead run's wall time for each, and the overhead per delegation,
(delegations - plain calls) / N, at N = 1, 8 and 64: the price of a child being a run of its
own (its row, its events, its checkpoints, its lease, its model turn through the gateway).

`--repeats K` (default 5): the median of K runs of each.

`--cancel` (ADR 0066): three-level trees cancelled at random moments, on SQLite and on a
throwaway Postgres (`tests/postgres.py`), in one process: model calls started after the cancel
was recorded against the runs open then, and the time until every run of the tree has ended
(`benchmarks/subagents_cancel.py`). `--trials N` (default 10) trees each.

`--pool` (ADR 0069): children as queued runs on real `keel worker`s over a throwaway Postgres
(`benchmarks/subagents_pool.py`): 32 children spread over one worker and two, `kill -9` of a
worker at each failpoint of a fan-out, and cancels of a three-level tree on two workers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

try:
    from keel import Agent, Limits, ScriptedTransport
except ModuleNotFoundError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from keel import Agent, Limits, ScriptedTransport


async def plain(task: str) -> str:
    """A free tool: the baseline a delegation is compared with."""
    return f"read: {task}"


def lead(tool: str, width: int, tools: list[object], store: Path) -> Agent:
    calls = [{"name": tool, "arguments": {"task": f"part {n}"}} for n in range(width)]
    model = ScriptedTransport.from_dict({"turns": [{"tool_calls": calls}, {"text": "done"}]})
    return Agent(
        model,
        tools=tools,  # type: ignore[arg-type]
        store=store,
        limits=Limits(max_children=width, max_tool_calls=4 * width, max_model_calls=4 * width),
    )


def timed(agent: Agent, children: int = 0) -> float:
    started = time.perf_counter()
    with agent:
        result = agent.run("Read the parts.")
    elapsed = (time.perf_counter() - started) * 1000
    assert result.status == "completed", result
    assert len(result.children) == children and all(
        c.status == "completed" for c in result.children
    ), result.children
    return elapsed


def measure(width: int, repeats: int, folder: Path) -> tuple[float, float]:
    child_script = folder / "child.json"
    child_script.write_text(json.dumps({"turns": [{"text": "The part says alpha."}]}))
    plain_ms, delegated_ms = [], []
    for n in range(repeats):
        plain_ms.append(timed(lead("plain", width, [plain], folder / f"p{width}-{n}.sqlite")))
        reader = Agent(f"script:{child_script}", limits=Limits(max_model_calls=3))
        tools = [reader.as_tool("reader", "Reads one part")]
        delegated = lead("reader", width, tools, folder / f"d{width}-{n}.sqlite")
        delegated_ms.append(timed(delegated, children=width))
    return statistics.median(plain_ms), statistics.median(delegated_ms)


def cancelling(trials: int) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from subagents_cancel import HEADER, cancel_trials, summary

    from postgres import start_cluster, stop_cluster

    width, delay = 3, 50.0
    print(f"Keel sub-agents: a tree of 1 + {width} + {width * width} runs, models {delay:g} ms, "
          "cancelled at a random moment by another store handle")  # fmt: skip
    print(HEADER)
    with tempfile.TemporaryDirectory() as tmp:
        found = cancel_trials(lambda n: Path(tmp) / f"c{n}.sqlite", trials, width, delay)
        print(summary("sqlite", found))
    cluster = start_cluster()
    try:
        def database(n: int) -> str:
            return cluster.url(cluster.create_database())

        found = cancel_trials(database, trials, width, delay)
        print(summary("postgres", found))
    finally:
        stop_cluster(cluster)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cancel", action="store_true", help="cancel trees at random moments")
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--pool", action="store_true", help="queued children on keel workers")
    args = parser.parse_args()
    if args.pool:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from subagents_pool import run_all

        run_all(args.trials, min(args.repeats, 3))
        return
    if args.cancel:
        cancelling(args.trials)
        return
    print(f"Keel sub-agents: a delegation against a plain tool call, median of {args.repeats}")
    print(f"{'children':>8} {'plain calls ms':>15} {'delegations ms':>15} {'ms/delegation':>14}")
    with tempfile.TemporaryDirectory() as tmp:
        for width in (1, 8, 64):
            plain_ms, delegated_ms = measure(width, args.repeats, Path(tmp))
            per = (delegated_ms - plain_ms) / width
            print(f"{width:>8} {plain_ms:>15.1f} {delegated_ms:>15.1f} {per:>14.2f}")


if __name__ == "__main__":
    main()
