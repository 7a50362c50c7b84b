"""Children any worker may take (ADR 0069): on a real Postgres store advanced by real
`keel worker` processes, a delegation queues its child as a run of its own; the parent waits
`awaiting_children` without holding a worker, and the last child to end queues it again."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from keel.agent import new_run_id
from keel.assemble import build_agent
from keel.limits import Limits
from keel.pool.dispatch import Dispatch
from keel.records import JsonObject
from keel.store.postgres_store import PostgresStore
from pool import Pool, call

LEAD_ANSWER = "The parts agree: leases expire."


def lead_script(width: int, latency_ms: int = 50) -> dict[str, Any]:
    calls = [call("reader", task=f"Read part {n} of the notes.") for n in range(width)]
    return {"turns": [{"tool_calls": calls}, {"text": LEAD_ANSWER}], "latency_ms": latency_ms}


def child_script(latency_ms: int = 200) -> dict[str, Any]:
    return {
        "turns": [
            {"tool_calls": [call("read_file", path="notes.md")]},
            {"tool_calls": [call("write_file", path="log.txt", content="one\n", append=True)]},
            {"text": "Leases expire."},
        ],
        "latency_ms": latency_ms,
    }


@pytest.fixture
def pool(tmp_path: Path, pg_url: str) -> Iterator[Pool]:
    made = Pool(tmp_path, pg_url, lead_script(1))
    yield made
    made.stop_all()


def submit_tree(
    pool: Pool,
    tmp_path: Path,
    width: int,
    limits: Limits | None = None,
    child: dict[str, Any] | None = None,
    approve_writes: bool = True,
    lead: dict[str, Any] | None = None,
    extra: dict[str, JsonObject] | None = None,
) -> str:
    """A lead whose first turn delegates `width` tasks to `reader`, submitted as `keel submit
    --agent reader` would (the `[agents.reader]` table saved with the run)."""
    (tmp_path / "lead.json").write_text(json.dumps(lead or lead_script(width)))
    (tmp_path / "child.json").write_text(json.dumps(child or child_script()))
    reader: JsonObject = {
        "description": "Reads the notes and logs that it did",
        "model": f"script:{tmp_path / 'child.json'}",
        "instructions": None,
        "tools": ["read_file", "write_file"],
        "approve_tools": ["write_file"] if approve_writes else [],
        "limits": {},
    }
    settings: JsonObject = {
        "repo": str(pool.repo),
        "allow_hosts": [],
        "allow_writes": True,
        "agents": {"reader": reader, **(extra or {})},
    }
    store = PostgresStore(pool.url)
    dispatch = Dispatch(store)
    try:
        limits = limits or Limits(max_children=width, max_delegations=width)
        agent = build_agent(f"script:{tmp_path / 'lead.json'}", settings, limits, store, None)
        run_id = new_run_id()
        dispatch.submit(run_id, "What do the notes say?", agent.transport.name, agent.config())
    finally:
        dispatch.close()
        store.close()
    return run_id


def children_of(pool: Pool, run_id: str) -> list[dict[str, Any]]:
    with psycopg.connect(pool.url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT run_id, status, config, state FROM keel.runs"
            " WHERE (config::jsonb ->> 'parent_run') = %s ORDER BY run_id",
            (run_id,),
        ).fetchall()
    return [
        {"run_id": r, "status": s, "config": json.loads(c), "state": json.loads(st)}
        for r, s, c, st in rows
    ]


def statuses_seen(pool: Pool, run_id: str, until: set[str], timeout: float = 120) -> set[str]:
    """Every status `run_id` was seen in, polled until it is in `until`."""
    seen: set[str] = set()
    deadline = time.monotonic() + timeout
    with psycopg.connect(pool.url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute("SELECT status FROM keel.runs WHERE run_id = %s", (run_id,))
            status = str(row.fetchone()[0])  # type: ignore[index]
            seen.add(status)
            if status in until:
                return seen
            time.sleep(0.02)
    raise AssertionError(f"{run_id} never reached {until}: seen {seen}")


def started_by(pool: Pool, ids: set[str]) -> list[int]:
    """How many of the runs `ids` each worker process started (their `run_started` events
    name the owner, host:pid:...; the workers' logs are buffered)."""
    with psycopg.connect(pool.url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT data FROM keel.events WHERE type = 'run_started' AND run_id = ANY(%s)",
            (list(ids),),
        ).fetchall()
    pids = [str(json.loads(d)["owner"]).split(":")[1] for (d,) in rows]
    return [pids.count(str(w.pid)) for w in pool.workers]


def log_lines(pool: Pool) -> list[str]:
    path = pool.repo / "log.txt"
    return path.read_text().splitlines() if path.exists() else []


def test_children_of_one_parent_spread_over_two_workers(pool: Pool, tmp_path: Path) -> None:
    lead = submit_tree(pool, tmp_path, width=12)
    pool.worker("a", concurrency=2)
    pool.worker("b", concurrency=2)
    pool.wait_for([lead], {"completed"}, timeout=180)
    shown = pool.show(lead)
    assert shown["run"]["answer"] == LEAD_ANSWER
    children = children_of(pool, lead)
    assert len(children) == 12 and all(c["status"] == "completed" for c in children)
    ids = {c["run_id"] for c in children}
    by_a, by_b = started_by(pool, ids)
    assert by_a and by_b, f"a started {by_a} children, b {by_b}"
    assert by_a + by_b == 12  # each child started once
    assert log_lines(pool) == ["one"] * 12
    # what the children spent is folded into the parent: 2 calls of its own, 3 each of theirs
    assert shown["run"]["model_calls"] == 2 + 3 * 12
    # twelve children ended on two workers; the lead was queued again by exactly one of them
    pool.stop_all()  # the workers' logs are complete once they have exited
    woken = (pool.log("a") + pool.log("b")).count(f"{lead}: its children")
    assert woken == 1, woken
    assert sum(e["type"] == "run_resumed" for e in shown["events"]) == 1


def test_a_waiting_parent_holds_no_worker_so_one_slot_runs_its_children(
    pool: Pool, tmp_path: Path
) -> None:
    lead = submit_tree(pool, tmp_path, width=3)
    pool.worker("solo", concurrency=1)
    seen = statuses_seen(pool, lead, {"completed", "failed", "cancelled"})
    assert "awaiting_children" in seen, seen
    assert pool.status(lead) == "completed"
    children = children_of(pool, lead)
    assert [c["status"] for c in children] == ["completed"] * 3
    listed = pool.keel("runs").stdout
    assert lead in listed
    events = pool.show(lead)["events"]
    assert sum(e["type"] == "run_started" for e in events) == 1
    assert sum(e["type"] == "run_resumed" for e in events) >= 1  # queued again, taken up


def test_each_child_record_carries_what_a_worker_rebuilds_it_from(
    pool: Pool, tmp_path: Path
) -> None:
    lead = submit_tree(pool, tmp_path, width=2)
    pool.worker("a", concurrency=2)
    pool.wait_for([lead], {"completed"})
    for child in children_of(pool, lead):
        config = child["config"]
        assert config["as_agent"] == "reader" and config["agents"]["reader"]
        assert config["model"].endswith("child.json")
        assert config["tools"] == ["read_file", "write_file"]
        assert config["parent_run"] == lead and config["agent"] == "reader"


def test_budget_shares_are_reserved_in_the_child_records_and_folded_back(
    pool: Pool, tmp_path: Path
) -> None:
    limits = Limits(max_model_calls=11, max_children=3, max_delegations=3)
    lead = submit_tree(pool, tmp_path, width=3, limits=limits)
    pool.worker("a", concurrency=2)
    pool.worker("b", concurrency=2)
    pool.wait_for([lead], {"completed", "failed"}, timeout=180)
    children = children_of(pool, lead)
    # 11 calls, 1 spent by the lead's first turn, 1 kept for its answer: 9 shared by 3
    shares = [c["config"]["limits"]["max_model_calls"] for c in children]
    assert shares == [3, 3, 3], shares
    spent = [c["state"]["model_calls"] for c in children]
    shown = pool.show(lead)["run"]
    assert shown["status"] == "completed"
    assert shown["model_calls"] == 2 + sum(spent) <= 11


def test_a_child_recorded_but_never_enqueued_is_rescued_and_the_shares_stay_whole(
    pool: Pool, tmp_path: Path
) -> None:
    # 14 calls: the lead's 2, and 4 for each child. The resumed lead finds 2 children started:
    # the third is carved a share of what they do not hold, not a third of it.
    limits = Limits(max_model_calls=14, max_children=3, max_delegations=3)
    lead = submit_tree(pool, tmp_path, width=3, limits=limits)
    pool.env["KEEL_FAILPOINTS"] = "child_recorded:2"  # dies between a child's row and its enqueue
    first = pool.worker("a", concurrency=2)
    assert first.wait(timeout=60) == -9
    pool.env.pop("KEEL_FAILPOINTS")
    pool.worker("b", concurrency=2)
    pool.wait_for([lead], {"completed"}, timeout=180)
    children = children_of(pool, lead)
    assert [c["status"] for c in children] == ["completed"] * 3
    assert [c["config"]["limits"]["max_model_calls"] for c in children] == [4, 4, 4]
    assert len(log_lines(pool)) == 3
    for child in children:
        events = pool.show(child["run_id"])["events"]
        assert sum(e["type"] == "run_started" for e in events) == 1, "a child started twice"


def test_kill_9_of_a_worker_mid_fan_out_runs_no_child_twice(pool: Pool, tmp_path: Path) -> None:
    lead = submit_tree(pool, tmp_path, width=6)
    pool.env["KEEL_FAILPOINTS"] = "inside_side_effect:2"
    first = pool.worker("a", concurrency=3, lease_ttl=2.0)
    pool.env.pop("KEEL_FAILPOINTS")
    pool.worker("b", concurrency=3, lease_ttl=2.0)
    assert first.wait(timeout=90) == -9
    pool.wait_for([lead], {"completed"}, timeout=240)
    children = children_of(pool, lead)
    assert [c["status"] for c in children] == ["completed"] * 6
    assert len(log_lines(pool)) <= 6, "a side effect ran twice"
    for child in children:
        events = pool.show(child["run_id"])["events"]
        assert sum(e["type"] == "run_started" for e in events) == 1, "a child started twice"
        writes = [e for e in events if e["type"] == "tool_dispatched"]
        assert len(writes) <= 1, "a child's side effect was dispatched twice"


def test_cancelling_a_parent_that_waits_for_its_children_cancels_the_tree(
    pool: Pool, tmp_path: Path
) -> None:
    lead = submit_tree(pool, tmp_path, width=4, child=child_script(latency_ms=1500))
    pool.worker("a", concurrency=2)
    statuses_seen(pool, lead, {"awaiting_children"})
    done = pool.keel("cancel", lead, "--wait", "30")
    assert done.returncode == 0, done.stderr
    cancelled_at = time.time()
    pool.wait_for([lead], {"cancelled"}, timeout=10)
    children = children_of(pool, lead)
    pool.wait_for([c["run_id"] for c in children], {"cancelled", "completed"}, timeout=30)
    time.sleep(2.0)  # a woken parent or a late child would show here
    assert pool.status(lead) == "cancelled"
    for child in children_of(pool, lead):
        assert child["status"] == "cancelled"
        events = pool.show(child["run_id"])["events"]
        late = [e for e in events if e["type"] == "model_request" and e["at"] > cancelled_at]
        assert not late, "a model call started after the cancel"


def test_a_waiting_parent_shows_its_children_and_one_cancelled_child_answers_it(
    pool: Pool, tmp_path: Path
) -> None:
    from starlette.testclient import TestClient

    from keel.serve.a2a_tasks import TaskState, state_of
    from keel.ui.app import create_app
    from keel.ui.security import served_hosts

    lead = submit_tree(pool, tmp_path, width=2, child=child_script(latency_ms=1500))
    pool.worker("a", concurrency=2)
    statuses_seen(pool, lead, {"awaiting_children"})
    children = [c["run_id"] for c in children_of(pool, lead)]
    shown = pool.keel("show", lead)
    assert "awaiting_children" in shown.stdout
    assert all(f"waiting for child: {c}" in shown.stdout for c in children), shown.stdout
    assert sorted(pool.show(lead)["waiting_for"]) == sorted(children)
    listed = pool.keel("runs", "--status", "awaiting_children").stdout
    assert lead in listed
    store = PostgresStore(pool.url, read_only=True)
    try:
        record = store.get_run(lead)
        assert record is not None and state_of(record) == TaskState.TASK_STATE_WORKING
    finally:
        store.close()
    with TestClient(create_app(pool.url, served_hosts("127.0.0.1", 8350)),
                    base_url="http://127.0.0.1:8350") as web:  # fmt: skip
        page = web.get(f"/runs/{lead}").text
    assert "Waiting for its children" in page and all(f"/runs/{c}" in page for c in children)
    cancelled = pool.keel("cancel", children[0], "--wait", "30")
    assert cancelled.returncode == 0, cancelled.stderr
    pool.wait_for([lead], {"completed"}, timeout=120)
    statuses = {c["run_id"]: c["status"] for c in children_of(pool, lead)}
    assert statuses == {children[0]: "cancelled", children[1]: "completed"}
    results = [e for e in pool.show(lead)["events"] if e["type"] == "tool_result"]
    told = [r for r in results if r.get("is_error")]
    assert len(told) == 1 and "ended cancelled without an answer" in json.dumps(told[0])


def test_a_three_level_tree_declared_in_keel_toml_runs_on_two_workers(
    pool: Pool, tmp_path: Path
) -> None:
    scripts = {
        "lead": {"turns": [{"tool_calls": [call("middle", task=f"Middle {n}.") for n in range(2)]},
                           {"text": LEAD_ANSWER}]},
        "middle": {"turns": [{"tool_calls": [call("leaf", task=f"Leaf {n}.") for n in range(2)]},
                             {"text": "Both leaves read."}]},
        "leaf": {"turns": [{"tool_calls": [call("read_file", path="notes.md")]},
                           {"text": "Leases expire."}]},
    }  # fmt: skip
    for name, script in scripts.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(script))
    config = tmp_path / "config" / "keel"
    config.mkdir(parents=True)
    (config / "keel.toml").write_text(
        f'[agents.middle]\ndescription = "Starts leaves"\nmodel = "script:{tmp_path}/middle.json"\n'
        'tools = []\nagents = ["leaf"]\n\n'
        f'[agents.leaf]\ndescription = "Reads"\nmodel = "script:{tmp_path}/leaf.json"\n'
        'tools = ["read_file"]\n'
    )
    pool.env["XDG_CONFIG_HOME"] = str(tmp_path / "config")
    done = pool.keel(
        "submit", "What do the notes say?", "--model", f"script:{tmp_path}/lead.json",
        "--repo", str(pool.repo), "--agent", "middle", "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lead = json.loads(done.stdout)["run_id"]
    pool.worker("a", concurrency=2)
    pool.worker("b", concurrency=2)
    pool.wait_for([lead], {"completed"}, timeout=180)
    assert pool.show(lead)["run"]["answer"] == LEAD_ANSWER
    middles = children_of(pool, lead)
    assert [m["status"] for m in middles] == ["completed"] * 2
    leaves = [leaf for m in middles for leaf in children_of(pool, m["run_id"])]
    assert [leaf["status"] for leaf in leaves] == ["completed"] * 4
    assert all(leaf["config"]["limits"]["max_depth"] == 0 for leaf in leaves)
    with psycopg.connect(pool.url, autocommit=True) as conn:
        row = conn.execute("SELECT config FROM keel.runs WHERE run_id = %s", (lead,)).fetchone()
    assert row is not None
    tools = json.loads(row[0])["tools"]
    assert "middle" in tools and "leaf" not in tools  # the leaf is the middle's agent only


def test_a_child_queued_after_its_parents_cancel_was_recorded_calls_no_model(
    pool: Pool, tmp_path: Path
) -> None:
    """The cancel request of a parent a live process holds waits for that process; a child the
    parent queues meanwhile must end `cancelled` when a worker opens it, before any model call
    (its record's lineage reaches the open check)."""
    from keel.pool.children import QueuedChildren
    from keel.records import Lineage
    from keel.subagents import child_run_id

    lead = submit_tree(pool, tmp_path, width=1)
    store = PostgresStore(pool.url)
    dispatch = Dispatch(store)
    try:
        record = store.get_run(lead)
        assert record is not None
        with psycopg.connect(pool.url, autocommit=True) as conn:  # as `keel cancel` leaves it
            conn.execute("INSERT INTO keel.cancels (run_id, at) VALUES (%s, %s)", (lead, 0.0))
        child = child_run_id(lead, "k1_0")
        lineage = Lineage(parent_run=lead, parent_call="k1_0", agent="reader")
        QueuedChildren(dispatch).enqueue_child(child, "Read.", record.config.with_lineage(lineage))
    finally:
        dispatch.close()
        store.close()
    pool.worker("a", concurrency=2)
    pool.wait_for([child, lead], {"cancelled"}, timeout=60)
    for run_id in (child, lead):
        events = pool.show(run_id)["events"]
        assert not [e for e in events if e["type"] == "model_request"], run_id


def test_a_queued_childs_approval_pauses_its_parent_and_one_decision_finishes_both(
    pool: Pool, tmp_path: Path
) -> None:
    lead = submit_tree(pool, tmp_path, width=2, approve_writes=False)
    pool.worker("a", concurrency=2)
    pool.wait_for([lead], {"awaiting_approval"}, timeout=120)
    asked = [e for e in pool.show(lead)["events"] if e["type"] == "approval_requested"]
    assert len(asked) == 2 and all(":" in e["call_id"] for e in asked)  # CHILD_RUN:CALL_ID
    for event in asked:
        done = pool.keel("approve", lead, event["call_id"], "--by", "ana")
        assert done.returncode == 0, done.stderr
    pool.wait_for([lead], {"completed"}, timeout=120)
    assert [c["status"] for c in children_of(pool, lead)] == ["completed"] * 2
    assert log_lines(pool) == ["one"] * 2


def test_keel_resume_of_a_waiting_parent_without_workers_runs_its_children_from_their_task(
    pool: Pool, tmp_path: Path
) -> None:
    """No worker left: `keel resume` continues the parent in one process, and its children,
    queued but never started, start there from their task (not as a resume of nothing)."""
    import signal

    lead = submit_tree(pool, tmp_path, width=3, child=child_script(latency_ms=2000))
    worker = pool.worker("a", concurrency=1)
    statuses_seen(pool, lead, {"awaiting_children"})
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    done = pool.keel("resume", lead, "--json", timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "completed"
    children = children_of(pool, lead)
    assert [c["status"] for c in children] == ["completed"] * 3
    assert log_lines(pool) == ["one"] * 3
    for child in children:
        events = pool.show(child["run_id"])["events"]
        assert events[0]["type"] == "run_started" and events[0]["question"].startswith("Read")
        first = next(e for e in events if e["type"] == "model_request")
        assert first["items"] >= 1, "the child's model was not sent its task"


def test_a_child_waiting_for_a_person_while_its_sibling_runs_is_decided_on_the_child(
    pool: Pool, tmp_path: Path
) -> None:
    """One child waits for a person while its sibling still runs: the parent waits
    `awaiting_children` (it lists the child's call once the sibling ends); a decision taken on
    the child meanwhile sends the child on, and the parent completes with no decision of its
    own."""
    writer_script = tmp_path / "writer.json"
    writer_script.write_text(json.dumps(child_script(latency_ms=50)))
    writer: JsonObject = {
        "description": "Logs, once a person agrees",
        "model": f"script:{writer_script}",
        "instructions": None,
        "tools": ["read_file", "write_file"],
        "approve_tools": [],
        "limits": {},
    }
    calls = [call("reader", task="Read the notes."), call("writer", task="Log a line.")]
    lead = submit_tree(
        pool, tmp_path, width=2, child=child_script(latency_ms=1500),
        lead={"turns": [{"tool_calls": calls}, {"text": LEAD_ANSWER}]}, extra={"writer": writer},
    )  # fmt: skip
    pool.worker("a", concurrency=2)
    writer_run = child_run_of(pool, lead, "writer")
    pool.wait_for([writer_run], {"awaiting_approval"}, timeout=60)
    assert pool.status(lead) == "awaiting_children"
    (asked,) = [e for e in pool.show(writer_run)["events"] if e["type"] == "approval_requested"]
    done = pool.keel("approve", writer_run, asked["call_id"], "--by", "ana")
    assert done.returncode == 0, done.stderr
    pool.wait_for([lead], {"completed"}, timeout=120)
    assert [c["status"] for c in children_of(pool, lead)] == ["completed"] * 2
    assert sorted(log_lines(pool)) == ["one", "one"]
    assert not [e for e in pool.show(lead)["events"] if e["type"] == "approval_requested"]


def child_run_of(pool: Pool, lead: str, agent: str, timeout: float = 60) -> str:
    """The run id of `lead`'s child started through `agent`, once it is recorded."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [c["run_id"] for c in children_of(pool, lead) if c["config"]["agent"] == agent]
        if found:
            return found[0]
        time.sleep(0.05)
    raise AssertionError(f"no {agent} child of {lead}")
