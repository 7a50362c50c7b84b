"""`keel ui` on a Postgres store (ADR 0025, ADR 0026): the pages read it through the RunStore,
a decision is recorded there and queues the run for the workers (a real `keel worker` then
finishes it), and the URL's password never shows. A real throwaway cluster (`postgres.py`)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from keel.ui.app import create_app
from keel.ui.security import served_hosts
from pool import Pool, call
from postgres import PASSWORD, free_port

BASE = "http://127.0.0.1:8350"
ANSWER = "Logged one line."
WRITE_CALL = "k2_0"
"""Keel's id for the script's write (step 2, first call; ADR 0030)."""
SCRIPT = {
    "turns": [
        {"tool_calls": [call("read_file", path="notes.md")]},
        {"tool_calls": [call("write_file", path="log.txt", content="one\n", append=True)]},
        {"text": ANSWER},
    ],
}


@pytest.fixture
def pool(tmp_path: Path, pg_url: str) -> Iterator[Pool]:
    made = Pool(tmp_path, pg_url, SCRIPT)
    yield made
    made.stop_all()


def client(url: str) -> TestClient:
    return TestClient(create_app(url, served_hosts("127.0.0.1", 8350)), base_url=BASE)


def csrf(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found, "the page has no form"
    return found.group(1)


def local_run(pool: Pool, *extra: str) -> dict[str, Any]:
    """`keel run --json` on the Postgres store, in a process of its own."""
    done = pool.keel(
        "run", "What do the notes say?", "--model", f"script:{pool.script}",
        "--repo", str(pool.repo), "--allow-writes", "--json", *extra,
    )  # fmt: skip
    assert done.returncode in (0, 3), done.stderr
    out: dict[str, Any] = json.loads(done.stdout)
    return out


def test_the_runs_page_and_a_run_page_read_a_postgres_store(pool: Pool) -> None:
    done = local_run(pool, "--approve-tools", "write_file")
    paused = local_run(pool)
    assert done["status"] == "completed" and paused["status"] == "awaiting_approval"
    with client(pool.url) as ui:
        runs = ui.get("/").text
        assert "2 runs" in runs and done["run_id"] in runs and paused["run_id"] in runs
        filtered = ui.get("/", params={"status": "awaiting_approval"}).text
        assert "1 run awaiting approval" in filtered and done["run_id"] not in filtered
        page = ui.get(f"/runs/{done['run_id']}").text
        assert ANSWER in page and "log.txt" in page
        assert 'class="ev tool-call' in page
        waiting = ui.get(f"/runs/{paused['run_id']}").text
        assert "Waiting for approval" in waiting
        assert f"/runs/{paused['run_id']}/calls/{WRITE_CALL}/approve" in waiting
        live = ui.get(f"/runs/{done['run_id']}/live").text
        assert "event: update" in live and '"status": "completed"' in live


def test_approving_on_a_postgres_store_queues_the_run_for_a_worker(pool: Pool) -> None:
    """The decision is recorded in Postgres and the run queued, not resumed here: the page says
    so, and a `keel worker` (not `keel ui`) completes it."""
    pool.worker("a", concurrency=1)  # sets the queue up, as on any deployment
    run_id = pool.submit("Log a line?")
    pool.wait_for([run_id], {"awaiting_approval"})
    with client(pool.url) as ui:
        page = ui.get(f"/runs/{run_id}").text
        response = ui.post(
            f"/runs/{run_id}/calls/{WRITE_CALL}/approve",
            data={"csrf": csrf(page), "by": "ana"},
            follow_redirects=False,
        )
        assert response.status_code == 303, response.text
        pool.wait_for([run_id], {"completed"})
        done = ui.get(f"/runs/{run_id}").text
    assert "approved by <strong>ana</strong>" in done and ANSWER in done
    assert (pool.repo / "log.txt").read_text() == "one\n"
    assert run_id in pool.log("a") and "completed" in pool.log("a")
    decided = [e for e in pool.show(run_id)["events"] if e["type"] == "approval_decided"]
    assert [e["by"] for e in decided] == ["ana"]


def test_a_decided_run_on_postgres_says_it_is_queued_for_a_keel_worker(pool: Pool) -> None:
    """No worker runs yet: the page after the decision says the run waits for one, never that
    `keel ui` resumes it; a worker started later takes it from the queue."""
    first = pool.worker("a", concurrency=1)
    run_id = pool.submit("Log a line?")
    pool.wait_for([run_id], {"awaiting_approval"})
    first.terminate()
    assert first.wait(timeout=30) == 0
    with client(pool.url) as ui:
        page = ui.get(f"/runs/{run_id}").text
        ui.post(
            f"/runs/{run_id}/calls/{WRITE_CALL}/approve", data={"csrf": csrf(page), "by": "ana"}
        )
        after = ui.get(f"/runs/{run_id}").text
        assert "queued for a keel worker" in after and "resuming" not in after
        assert pool.status(run_id) == "awaiting_approval"  # nothing here resumed it
        pool.worker("b", concurrency=1)
        pool.wait_for([run_id], {"completed"})


def test_a_decision_where_no_worker_set_the_queue_up_says_how_to_continue(pool: Pool) -> None:
    """No `keel worker` ever ran on this database, so the run is not queued yet: the page says
    so and how it continues, instead of claiming it is queued (and so does `keel approve`)."""
    first, second = local_run(pool)["run_id"], local_run(pool)["run_id"]
    with client(pool.url) as ui:
        page = ui.get(f"/runs/{first}").text
        ui.post(f"/runs/{first}/calls/{WRITE_CALL}/approve", data={"csrf": csrf(page), "by": "ana"})
        after = ui.get(f"/runs/{first}").text
    assert "no keel worker has set the queue up on this store yet" in after
    assert f"the first keel worker to start takes it (or `keel resume {first}`)" in after
    approved = pool.keel("approve", second, "--all")
    assert approved.returncode == 0, approved.stderr
    said = " ".join(approved.stderr.split())  # the console wraps long lines
    assert f"takes it (or: keel resume {second})" in said and "queued:" not in said


def test_a_run_decided_before_any_worker_started_is_taken_by_the_first_worker(
    pool: Pool,
) -> None:
    """The enqueue after a decision fails while no worker has set DBOS's queue up; the first
    worker to start must still take the run (its start-up rescue), as it takes a submitted one.
    A paused run with a call still undecided stays paused."""
    decided, undecided = local_run(pool)["run_id"], local_run(pool)["run_id"]
    approved = pool.keel("approve", decided, "--all")
    assert approved.returncode == 0, approved.stderr
    assert "the first keel worker to start takes it" in " ".join(approved.stderr.split())
    pool.worker("first", concurrency=1)
    pool.wait_for([decided], {"completed"}, timeout=90)
    assert pool.status(undecided) == "awaiting_approval"


def serve(pool: Pool, store: str | None, env: dict[str, str]) -> tuple[str, subprocess.Popen[str]]:
    args = [sys.executable, "-m", "keel", "ui", "--port", "0"]
    process = subprocess.Popen(
        args + (["--store", store] if store else []),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=pool.repo,
    )
    assert process.stdout is not None
    return process.stdout.readline().strip(), process


def test_keel_ui_serves_a_postgres_store_named_by_keel_store(pool: Pool) -> None:
    """Like `keel show`: `--store URL`, or KEEL_STORE when it is not given."""
    run_id = local_run(pool, "--approve-tools", "write_file")["run_id"]
    for store, env in ((pool.url, pool.env), (None, {**pool.env, "KEEL_STORE": pool.url})):
        url, process = serve(pool, store, env)
        try:
            assert re.fullmatch(r"http://127\.0\.0\.1:\d+/", url), url
            page = httpx.get(url).text
            assert "1 run" in page and run_id in page
            assert PASSWORD not in page + httpx.get(f"{url}runs/{run_id}").text
        finally:
            process.terminate()
            _, err = process.communicate(timeout=30)
        assert PASSWORD not in url + err


def test_an_unreachable_postgres_store_is_one_line_without_the_password() -> None:
    secret = "hunter2-never-shown"
    url = f"postgresql://keel:{secret}@127.0.0.1:{free_port()}/keel"
    env = {k: v for k, v in os.environ.items() if k != "KEEL_STORE"}
    done = subprocess.run(
        [sys.executable, "-m", "keel", "ui", "--store", url, "--port", "0"],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert "cannot reach the store postgresql://keel:***@127.0.0.1" in done.stderr
    assert secret not in done.stdout + done.stderr and done.stdout == ""
