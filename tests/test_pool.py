"""Many machines (ADR 0026): `keel submit` and `keel worker` over a real Postgres database, with
every single-machine promise kept: one process advances a run, no side effect runs twice, a
paused run holds no queue slot, and a dead or stopped worker's runs are finished by another."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pool import Pool, call

ANSWER = "The notes say leases expire; one line was logged."
SCRIPT = {
    "turns": [
        {"tool_calls": [call("read_file", path="notes.md")]},
        {"tool_calls": [call("list_files")]},
        {"tool_calls": [call("write_file", path="log.txt", content="one\n", append=True)]},
        {"tool_calls": [call("read_file", path="notes.md", start_line=2)]},
        {"text": ANSWER},
    ],
    "latency_ms": 300,
}


@pytest.fixture
def pool(tmp_path: Path, pg_url: str) -> Iterator[Pool]:
    made = Pool(tmp_path, pg_url, SCRIPT)
    yield made
    made.stop_all()


def log_lines(pool: Pool) -> list[str]:
    path = pool.repo / "log.txt"
    return path.read_text().splitlines() if path.exists() else []


def test_submit_prints_the_run_id_at_once_and_two_workers_finish_the_runs(pool: Pool) -> None:

    runs = [pool.submit(f"Question {n}?", "--approve-tools", "write_file") for n in range(4)]
    listed = pool.keel("runs", "--status", "queued").stdout
    assert all(r in listed for r in runs)
    pool.worker("a", concurrency=2)
    pool.worker("b", concurrency=2)
    pool.wait_for(runs, {"completed"})
    for run_id in runs:
        shown = pool.show(run_id)
        assert shown["run"]["answer"] == ANSWER
    assert log_lines(pool) == ["one"] * 4
    assert "completed" in pool.log("a") + pool.log("b")


def test_keel_submit_on_a_sqlite_store_is_refused_in_one_line(tmp_path: Path) -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "keel", "submit", "Q?", "--model", "script:x.json",
         "--store", str(tmp_path / "runs.sqlite")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr


def slow(pool: Pool) -> None:
    """Each model turn takes 0.8 s, so a run is still running when a worker is stopped."""
    pool.script.write_text(json.dumps({**SCRIPT, "latency_ms": 800}))


def test_a_stopped_worker_checkpoints_its_runs_and_another_finishes_them(pool: Pool) -> None:
    slow(pool)
    runs = [pool.submit(f"Q{n}?", "--approve-tools", "write_file") for n in range(2)]
    first = pool.worker("a")
    pool.wait_for(runs, {"running"})
    time.sleep(0.5)
    first.send_signal(signal.SIGTERM)
    begun = time.monotonic()
    assert first.wait(timeout=30) == 0
    assert time.monotonic() - begun < 5, "a stop waits for the current step only"
    assert "queued again" in pool.log("a")
    pool.worker("b")
    pool.wait_for(runs, {"completed"})
    for run_id in runs:
        events = pool.show(run_id)["events"]
        assert any(e["type"] == "run_resumed" for e in events)
        assert not [e for e in events if e["type"] == "tool_result" and e.get("uncertain")]
    assert log_lines(pool) == ["one", "one"]


def test_a_killed_workers_runs_are_finished_by_another_after_the_lease_expires(
    pool: Pool,
) -> None:
    slow(pool)
    runs = [pool.submit(f"Q{n}?", "--approve-tools", "write_file") for n in range(3)]
    first = pool.worker("a", lease_ttl=2.0)
    pool.wait_for(runs, {"running"})
    time.sleep(0.8)
    first.send_signal(signal.SIGKILL)
    first.wait()
    pool.worker("b", lease_ttl=2.0)
    pool.wait_for(runs, {"completed"}, timeout=90)
    for run_id in runs:
        assert pool.show(run_id)["run"]["answer"] == ANSWER
    log = log_lines(pool)
    assert len(log) <= 3, f"a side effect ran twice: {log}"


def awaiting(pool: Pool, run_id: str) -> list[dict[str, Any]]:
    events = pool.show(run_id)["events"]
    return [e for e in events if e["type"] == "approval_requested"]


def test_a_run_paused_on_one_worker_is_approved_elsewhere_and_finished_by_another(
    pool: Pool,
) -> None:
    paused = pool.submit("Log a line?")
    first = pool.worker("a", concurrency=1)
    pool.wait_for([paused], {"awaiting_approval"})
    # The paused run holds no queue slot: worker a (concurrency 1) takes the next run at once.
    other = pool.submit("Another?", "--approve-tools", "write_file")
    pool.wait_for([other], {"completed"})
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=30) == 0
    pool.worker("b", concurrency=1)
    (asked,) = awaiting(pool, paused)
    approved = pool.keel("approve", paused, asked["call_id"], "--by", "ana")
    assert approved.returncode == 0, approved.stderr
    assert "a keel worker continues" in approved.stderr
    pool.wait_for([paused], {"completed"})
    assert "completed" in pool.log("b") and paused in pool.log("b")
    decided = [e for e in pool.show(paused)["events"] if e["type"] == "approval_decided"]
    assert decided[0]["by"] == "ana"
