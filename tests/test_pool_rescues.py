"""Workers and hostile runs (tracker issue 20): a run that kills its worker at the same step on
every resume is given up after a bounded number of rescues, and text Keel cannot store reaches
a worker's run as U+FFFD, never as a crash that the next worker repeats."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from keel.pool.dispatch import MAX_RESCUES
from pool import Pool, call

pytest_plugins = ["postgres"]

SCRIPT = {
    "turns": [
        {"tool_calls": [call("read_file", path="notes.md")]},
        {"text": "The notes say leases expire \ud800."},
    ]
}


@pytest.fixture
def pool(tmp_path: Path, pg_url: str) -> Iterator[Pool]:
    made = Pool(tmp_path, pg_url, SCRIPT)
    yield made
    made.stop_all()


def test_a_run_that_kills_its_worker_every_time_is_failed_after_bounded_rescues(
    pool: Pool,
) -> None:
    run_id = pool.submit()
    pool.env["KEEL_FAILPOINTS"] = "after_model_response:1"  # each worker dies on the run
    deadline = time.monotonic() + 240
    started = 0
    while pool.status(run_id) != "failed":
        assert time.monotonic() < deadline, f"still {pool.status(run_id)} after {started} workers"
        worker = pool.worker(f"w{started}", lease_ttl=1.0)
        started += 1
        while worker.poll() is None and pool.status(run_id) != "failed":
            time.sleep(0.2)
    shown = pool.show(run_id)
    failure = shown["run"]["failure"]
    assert failure["kind"] == "RescuesExhausted", failure
    assert f"rescued this run {MAX_RESCUES} times" in failure["message"], failure
    requests = [e for e in shown["events"] if e["type"] == "model_request"]
    assert len(requests) <= MAX_RESCUES + 2  # bounded: not one more per rescue, forever
    ended = [e for e in shown["events"] if e["type"] == "run_failed"]
    assert [e["kind"] for e in ended] == ["RescuesExhausted"]


def test_a_lone_surrogate_in_a_workers_run_is_stored_and_the_run_completes(pool: Pool) -> None:
    run_id = pool.submit()
    worker = pool.worker("a")
    try:
        pool.wait_for([run_id], {"completed", "failed"}, timeout=90)
    finally:
        pool.stop_all()
    assert worker.returncode is not None
    run = pool.show(run_id)["run"]
    assert run["status"] == "completed"
    assert run["answer"] == "The notes say leases expire \ufffd."

