"""Children any worker may take (ADR 0069), for `benchmarks/subagents.py --pool`.

Everything runs on a throwaway Postgres cluster (`tests/postgres.py`) with real `keel worker`
processes (`tests/pool.py`) and scripted models, the runs submitted as `keel submit --agent`
would (the `[agents.*]` tables saved with the lead). Three measurements:

- spread: a lead delegates 32 tasks in one turn; each child reads a file and answers. The
  fan-out's wall time (from the submit until the lead has completed, workers already up) with
  one worker, then two, and how many children each worker ran (from the workers' logs).
- kill: for each failpoint a fan-out passes (keel/failpoints.py, and `child_recorded`, between
  a child's row and its enqueue), either worker is armed to SIGKILL itself the K-th time it
  passes it: worker a, which took the lead, or worker b, started once a has, which can take
  only children until the lead is queued again. Checked from the store: every child
  completed, started once, each child's write dispatched at most once, the log file's lines
  at most one per child, the tree's model calls within the lead's cap.
- cancel: a three-level tree (lead, 3 middles, 9 leaves each calling a tool every turn) on two
  workers, cancelled at a random moment by another store handle (as `keel cancel`): model calls
  sent after the cancel was recorded (a request event after it that got a response) against
  the runs open then (the bound: one in-flight call each), and the time until every run of the
  tree has ended.

`KEEL_BENCH_POINTS=a,b` limits the kill table to those failpoints.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from keel.agent import new_run_id
from keel.assemble import build_agent
from keel.limits import Limits
from keel.pool.dispatch import Dispatch
from keel.records import JsonObject
from keel.result import TERMINAL
from keel.store.postgres_store import PostgresStore

__all__ = ["cancel_table", "kill_table", "spread_table"]

FAILPOINTS = (
    tuple(os.environ.get("KEEL_BENCH_POINTS", "").split(","))
    if os.environ.get("KEEL_BENCH_POINTS")
    else (
        "step_start",
        "after_model_response",
        "after_journal",
        "before_side_effect",
        "inside_side_effect",
        "after_checkpoint",
        "after_results",
        "child_recorded",
    )
)
KILL_WIDTH = 8


def _call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


def submit(
    url: str, folder: Path, lead: dict[str, Any], tables: dict[str, Any], limits: Limits, repo: Path
) -> str:
    """Submit a lead (its script `lead`) offering the agents of `tables`, each table's model a
    script given as a dict (written to a file here)."""
    saved: dict[str, Any] = {}
    for name, table in tables.items():
        script = folder / f"{name}-{new_run_id()}.json"
        script.write_text(json.dumps(table["script"]))
        saved[name] = {k: v for k, v in table.items() if k != "script"}
        saved[name]["model"] = f"script:{script}"
    lead_file = folder / f"lead-{new_run_id()}.json"
    lead_file.write_text(json.dumps(lead))
    settings: JsonObject = {
        "repo": str(repo),
        "allow_hosts": [],
        "allow_writes": True,
        "agents": saved,
    }
    store = PostgresStore(url)
    dispatch = Dispatch(store)
    try:
        agent = build_agent(f"script:{lead_file}", settings, limits, store, None)
        run_id = new_run_id()
        dispatch.submit(run_id, "What do the notes say?", agent.transport.name, agent.config())
    finally:
        dispatch.close()
        store.close()
    return run_id


def table(description: str, script: dict[str, Any], tools: list[str], **extra: Any) -> Any:
    return {
        "description": description,
        "script": script,
        "tools": tools,
        "instructions": None,
        "approve_tools": [t for t in tools if t == "write_file"],
        "limits": {},
        **extra,
    }


def fan_out(width: int, child: dict[str, Any], latency_ms: int = 20) -> dict[str, Any]:
    calls = [_call("reader", task=f"Read part {n}.") for n in range(width)]
    return {"turns": [{"tool_calls": calls}, {"text": "All parts read."}], "latency_ms": latency_ms}


def tree_runs(conn: psycopg.Connection[Any], root: str) -> list[tuple[str, str]]:
    rows = conn.execute(
        "WITH RECURSIVE t(id) AS (SELECT %s::text UNION SELECT r.run_id FROM keel.runs r"
        " JOIN t ON (r.config::jsonb ->> 'parent_run') = t.id)"
        " SELECT r.run_id, r.status FROM keel.runs r JOIN t ON r.run_id = t.id",
        (root,),
    ).fetchall()
    return [(str(r), str(s)) for r, s in rows]


def wait_ended(url: str, root: str, timeout: float = 300) -> float:
    """Poll until `root` has ended; the time it took."""
    begun = time.monotonic()
    with psycopg.connect(url, autocommit=True) as conn:
        while time.monotonic() - begun < timeout:
            row = conn.execute("SELECT status FROM keel.runs WHERE run_id = %s", (root,))
            found = row.fetchone()
            if found is not None and found[0] in TERMINAL:
                return time.monotonic() - begun
            time.sleep(0.02)
    raise TimeoutError(f"{root} did not end in {timeout} s")


def up(
    pool: Any, names: list[str], concurrency: int, env: dict[str, str] | None = None
) -> list[Any]:
    """Start workers and wait until each takes runs."""
    procs = []
    for name in names:
        if env is not None:
            pool.env.update(env)
        procs.append(pool.worker(name, concurrency=concurrency, lease_ttl=2.0))
        if env is not None:
            for key in env:
                pool.env.pop(key, None)
    deadline = time.monotonic() + 60
    while not all("taking runs" in pool.log(n) for n in names):
        if time.monotonic() > deadline:
            raise TimeoutError("workers did not start")
        time.sleep(0.1)
    return procs


def child_counts(url: str, procs: list[Any], ids: set[str]) -> list[int]:
    """How many of the runs `ids` each worker process started, from the owner (host:pid:...)
    their `run_started` events name."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT data FROM keel.events WHERE type = 'run_started' AND run_id = ANY(%s)",
            (list(ids),),
        ).fetchall()
    pids = [str(json.loads(d)["owner"]).split(":")[1] for (d,) in rows]
    return [pids.count(str(p.pid)) for p in procs]


def spread_table(pool_for: Callable[[str], Any], width: int = 32, repeats: int = 3) -> None:
    child = {
        "turns": [
            {"tool_calls": [_call("read_file", path="notes.md")]},
            {"text": "Leases expire."},
        ],
        "latency_ms": 100,
    }
    print(
        f"spread: 1 lead, {width} children (2 scripted turns of 100 ms each), worker "
        f"concurrency 4, median of {repeats}"
    )
    print(f"{'workers':>7} {'fan-out s (median)':>18} {'runs':>24} {'children per worker':>22}")
    for workers in (1, 2):
        pool = pool_for(f"spread{workers}")
        names = [f"w{n}" for n in range(workers)]
        try:
            procs = up(pool, names, concurrency=4)
            times, counts = [], []
            for _ in range(repeats):
                lead = submit(
                    pool.url,
                    pool.logs.parent,
                    fan_out(width, child),
                    {"reader": table("Reads a part", child, ["read_file"])},
                    Limits(max_children=width, max_delegations=width),
                    pool.repo,
                )
                times.append(wait_ended(pool.url, lead))
                with psycopg.connect(pool.url, autocommit=True) as conn:
                    ids = {r for r, _ in tree_runs(conn, lead)} - {lead}
                counts.append(child_counts(pool.url, procs, ids))
            shown = ", ".join(f"{t:.2f}" for t in times)
            per = " / ".join(str(c) for c in counts[-1])
            print(f"{workers:>7} {statistics.median(times):>18.2f} {shown:>24} {per:>22}")
        finally:
            pool.stop_all()


def kill_table(pool_for: Callable[[str], Any], hit: int = 3) -> None:
    child = {
        "turns": [
            {"tool_calls": [_call("read_file", path="notes.md")]},
            {"tool_calls": [_call("write_file", path="log.txt", content="one\n", append=True)]},
            {"text": "Logged."},
        ],
        "latency_ms": 150,
    }
    cap = 2 + 4 * KILL_WIDTH  # a share of 4 calls each: 3 and one lost to a crash
    print(
        f"kill -9: 1 lead, {KILL_WIDTH} children (read, write once, answer); worker a takes the "
        f"lead, worker b starts once it has; the victim dies at pass {hit} (a) or 1 (b) of a "
        f"failpoint; "
        f"lead's cap {cap} model calls"
    )
    print(
        f"{'failpoint':<22} {'victim':>6} {'killed':>6} {'completed':>9} {'started twice':>13} "
        f"{'writes twice':>12} {'log lines':>9} {'tree calls':>10} {'s':>5}"
    )
    for point in FAILPOINTS:
        for victim in ("a", "b"):
            pool = pool_for(f"kill-{point}-{victim}")
            try:
                row = _kill_once(pool, point, victim, hit, child, cap)
                print(f"{point:<22} {victim:>6} {row}")
            finally:
                pool.stop_all()


def _kill_once(pool: Any, point: str, victim: str, hit: int, child: Any, cap: int) -> str:
    """One fan-out with `victim` armed to die at `point`; its row of the table."""
    armed = {"KEEL_FAILPOINTS": f"{point}:{hit if victim == 'a' else 1}"}  # b sees fewer
    a = up(pool, ["a"], concurrency=4, env=armed if victim == "a" else None)[0]
    lead = submit(
        pool.url,
        pool.logs.parent,
        fan_out(KILL_WIDTH, child),
        {"reader": table("Reads and logs", child, ["read_file", "write_file"])},
        Limits(max_model_calls=cap, max_children=KILL_WIDTH),
        pool.repo,
    )
    pool.wait_for([lead], {"running", "awaiting_children", "completed"})  # a has it
    b = up(pool, ["b"], concurrency=4, env=armed if victim == "b" else None)[0]
    took = wait_ended(pool.url, lead)
    killed = (a if victim == "a" else b).poll() == -9
    done, twice, writes, lines, calls = _kill_row(pool, lead)
    return (
        f"{'yes' if killed else 'no':>6} {done:>9} {twice:>13} {writes:>12} {lines:>9} "
        f"{calls:>10} {took:>5.1f}"
    )


def _kill_row(pool: Any, lead: str) -> tuple[str, int, int, int, str]:
    with psycopg.connect(pool.url, autocommit=True) as conn:
        runs = tree_runs(conn, lead)
        children = [r for r, _ in runs if r != lead]
        done = sum(s == "completed" for r, s in runs if r != lead)
        twice = writes = 0
        for run_id in children:
            kinds = [
                t
                for (t,) in conn.execute(
                    "SELECT type FROM keel.events WHERE run_id = %s", (run_id,)
                ).fetchall()
            ]
            twice += kinds.count("run_started") > 1
            writes += kinds.count("tool_dispatched") > 1
        state = conn.execute("SELECT status, state FROM keel.runs WHERE run_id = %s", (lead,))
        status, raw = state.fetchone()  # type: ignore[misc]
    log = pool.repo / "log.txt"
    lines = len(log.read_text().splitlines()) if log.exists() else 0
    calls = json.loads(raw)["model_calls"]
    return f"{done}/{len(children)}", twice, writes, lines, f"{calls} ({status})"


def cancel_table(pool_for: Callable[[str], Any], trials: int, seed: int = 7) -> None:
    rng = random.Random(seed)
    leaf = {
        "turns": [
            {"tool_calls": [_call("read_file", path="notes.md", start_line=k)]}
            for k in range(1, 31)
        ]
        + [{"text": "Read."}],
        "latency_ms": 100,
        "on_synthesis": {"text": "partial"},
    }
    middle = {
        "turns": [
            {"tool_calls": [_call("leaf", task=f"Leaf {n}.") for n in range(3)]},
            {"text": "Middle done."},
        ],
        "latency_ms": 100,
    }
    lead = {
        "turns": [
            {"tool_calls": [_call("middle", task=f"Middle {n}.") for n in range(3)]},
            {"text": "Lead done."},
        ],
        "latency_ms": 100,
    }
    tables = {
        "middle": table("Starts leaves", middle, [], agents=["leaf"]),
        "leaf": table("Reads", leaf, ["read_file"], below=True),
    }
    print(
        f"cancel: a tree of 1 + 3 + 9 runs on two workers (concurrency 8), models 100 ms, "
        f"cancelled at a random moment (0.5-4 s) by another store handle; {trials} trials"
    )
    print(f"{'trial':>5} {'at s':>5} {'open':>5} {'sent after':>10} {'quiet ms':>9} {'ended':>14}")
    pool = pool_for("cancel")
    quiet_all, late_all = [], 0
    try:
        up(pool, ["a", "b"], concurrency=8)
        store = PostgresStore(pool.url)
        try:
            for trial in range(trials):
                limits = Limits(max_model_calls=400, max_tool_calls=400)
                root = submit(pool.url, pool.logs.parent, lead, tables, limits, pool.repo)
                at = rng.uniform(0.5, 4.0)
                time.sleep(at)
                with psycopg.connect(pool.url, autocommit=True) as conn:
                    open_runs = sum(s not in TERMINAL for _, s in tree_runs(conn, root))
                    store.request_cancel(root)
                    recorded = time.time()
                    while True:
                        runs = tree_runs(conn, root)
                        if all(s in TERMINAL for _, s in runs):
                            break
                        time.sleep(0.01)
                    quiet = (time.time() - recorded) * 1000
                    late = _sent_after(conn, [r for r, _ in runs], recorded)
                ends = ",".join(sorted({s for _, s in runs}))
                quiet_all.append(quiet)
                late_all += int(late)
                print(
                    f"{trial:>5} {at:>5.2f} {open_runs:>5} {late:>11} {quiet:>9.0f} "
                    f"{len(runs):>2} {ends:>11}"
                )
        finally:
            store.close()
    finally:
        pool.stop_all()
    print(
        f"quiet median {statistics.median(quiet_all):.0f} ms, max {max(quiet_all):.0f} ms; "
        f"model calls sent after a cancel: {late_all} in {trials} trees"
    )


def _sent_after(conn: psycopg.Connection[Any], runs: list[str], recorded: float) -> int:
    """Model calls sent after the cancel was recorded: a `model_request` event after it that
    a `model_response` of the same run and step follows. A request event followed by the
    run's `run_cancelled` was journaled by the checkpoint that then found the cancel: that
    call was never sent (keel/_run/loop.py, `checkpoint`)."""
    rows = conn.execute(
        "SELECT run_id, type, at, data FROM keel.events WHERE run_id = ANY(%s)"
        " AND type IN ('model_request', 'model_response') ORDER BY run_id, seq",
        (runs,),
    ).fetchall()
    asked = {
        (r, json.loads(d)["step"]) for r, t, at, d in rows if t == "model_request" and at > recorded
    }
    answered = {(r, json.loads(d)["step"]) for r, t, _, d in rows if t == "model_response"}
    return len(asked & answered)


def run_all(trials: int, repeats: int) -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from pool import Pool
    from postgres import start_cluster, stop_cluster

    cluster = start_cluster()
    try:
        with tempfile.TemporaryDirectory() as tmp:

            def pool_for(name: str) -> Any:
                folder = Path(tmp) / name
                folder.mkdir()
                return Pool(folder, cluster.url(cluster.create_database()), {"turns": []})

            spread_table(pool_for, repeats=repeats)
            print()
            kill_table(pool_for)
            print()
            cancel_table(pool_for, trials)
    finally:
        stop_cluster(cluster)
