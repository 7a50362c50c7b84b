"""Workers and hostile runs (tracker issue 20): a run that kills its worker at the same step on
every resume is given up after a bounded number of rescues, and text Keel cannot store reaches
a worker's run as U+FFFD, never as a crash that the next worker repeats."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hostile_model import HostileModel, Turn
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



def test_two_calls_sharing_a_provider_id_on_a_worker_each_need_their_own_approval(
    tmp_path: Path, pg_url: str
) -> None:
    """A provider that reuses a call id within one batch, through a worker: two approvals
    are asked (Keel's own ids), one approval runs one write, and each write runs once."""
    turns: list[Turn] = [
        [
            ("call_1", "write_file", {"path": "a.txt", "content": "a\n"}),
            ("call_1", "write_file", {"path": "b.txt", "content": "b\n"}),
        ],
        "Both notes written.",
    ]
    pool = Pool(tmp_path, pg_url, {"turns": []})
    with HostileModel(turns) as server:
        try:
            done = pool.keel(
                "submit", "Write two notes.", "--model", "openai-chat:hostile", "--base-url",
                server.base_url, "--repo", str(pool.repo), "--allow-writes", "--json",
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            run_id = json.loads(done.stdout)["run_id"]
            pool.worker("a")
            pool.wait_for([run_id], {"awaiting_approval"})
            events = pool.show(run_id)["events"]
            asked = [e["call_id"] for e in events if e["type"] == "approval_requested"]
            assert len(asked) == 2 and len(set(asked)) == 2, asked
            first = pool.keel("approve", run_id, asked[0], "--by", "ana")
            assert first.returncode == 0, first.stderr
            time.sleep(1.0)
            assert pool.status(run_id) == "awaiting_approval"  # the other call still waits
            assert not (pool.repo / "a.txt").exists() and not (pool.repo / "b.txt").exists()
            second = pool.keel("approve", run_id, asked[1], "--by", "ana")
            assert second.returncode == 0, second.stderr
            pool.wait_for([run_id], {"completed"}, timeout=90)
            assert (pool.repo / "a.txt").read_text() == "a\n"
            assert (pool.repo / "b.txt").read_text() == "b\n"
        finally:
            pool.stop_all()
