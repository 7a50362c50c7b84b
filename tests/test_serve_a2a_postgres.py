"""`keel serve` on a Postgres store (ADR 0040): a decision on an input-required task hands the run
to the workers' queue when a `keel worker` has set it up, and resumes it in the server when none
has. The official `a2a-sdk` client drives a real `keel serve` and a real `keel worker` over a
throwaway database (`tests/postgres.py`)."""

from __future__ import annotations

import time
from pathlib import Path

from a2a.types import GetTaskRequest, TaskState

from a2a_serving import (
    WRITE,
    a2a,
    collect,
    decisions,
    final_state,
    keel_servers,
    paused,
)
from pool import Pool


def wait_for_line(path: Path, text: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while text not in (path.read_text() if path.exists() else ""):
        assert time.monotonic() < deadline, f"no {text!r} in {path}"
        time.sleep(0.05)


async def test_on_postgres_an_approved_task_goes_to_the_workers_queue(
    tmp_path: Path, pg_url: str
) -> None:
    (tmp_path / "pool").mkdir()
    pool = Pool(tmp_path / "pool", pg_url, WRITE)
    try:
        pool.worker("w", concurrency=1)
        wait_for_line(pool.logs / "w.log", "taking runs from")
        servers = {"s": (WRITE, ("--allow-writes",))}
        with keel_servers(tmp_path, servers, pg_url) as served:
            url, _ = served["s"]
            async with a2a(url) as client:
                task_id, call = await paused(client)
                approve = {"call_id": call["call_id"], "approve": True}
                after = await collect(client.send_message(decisions(task_id, approve)))
                task = await client.get_task(GetTaskRequest(id=task_id))
    finally:
        pool.stop_all()
    assert final_state(after) == TaskState.TASK_STATE_COMPLETED
    assert task.artifacts[0].parts[0].text == "Wrote out.txt."
    assert f"{task_id}: completed" in pool.log("w")  # the worker finished it, not the server
    assert (tmp_path / "repo" / "out.txt").read_text() == "hello\n"


async def test_on_postgres_without_a_worker_the_server_resumes_the_task(
    tmp_path: Path, pg_url: str
) -> None:
    with keel_servers(tmp_path, {"s": (WRITE, ("--allow-writes",))}, pg_url) as served:
        url, _ = served["s"]
        async with a2a(url) as client:
            task_id, call = await paused(client)
            approve = {"call_id": call["call_id"], "approve": True}
            after = await collect(client.send_message(decisions(task_id, approve)))
    assert final_state(after) == TaskState.TASK_STATE_COMPLETED
    assert (tmp_path / "repo" / "out.txt").read_text() == "hello\n"
