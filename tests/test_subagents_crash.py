"""A fan-out of three side-effecting children under `kill -9` (ADR 0046): real `keel`
processes, children declared as `[agents.NAME]` in keel.toml and offered with `--agent`; the
process is killed at a failpoint somewhere in the tree, then `keel resume PARENT`. Every side
effect happens at most once, finished children are read from the store (not run again), and the
parent completes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from keel.store import Store
from keel.subagents import child_run_id

WORDS = ("one", "two", "three")
ANSWER = "All three were logged."

# (failpoint, nth time the process passes it): the parent's and the children's steps, their
# journals, the writes themselves, results and checkpoints, all in one process.
KILL_POINTS = [
    *[("step_start", n) for n in (1, 2, 4, 7)],
    *[("after_journal", n) for n in (1, 2, 3)],
    *[("inside_side_effect", n) for n in (1, 2, 3)],
    *[("after_results", n) for n in (2, 5, 7)],
    *[("after_checkpoint", n) for n in (2, 5, 9)],
]


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


class Tree:
    """A lead agent and three writers, run through the real command line."""

    def __init__(self, tmp: Path) -> None:
        self.repo = tmp / "repo"
        self.repo.mkdir()
        (self.repo / "notes.md").write_text("Leases expire.\n")
        self.store = tmp / "runs.sqlite"
        self.config = tmp / "config"
        tables = []
        for word in WORDS:
            child = tmp / f"{word}.json"
            turns = [
                {"tool_calls": [call("read_file", path="notes.md")]},
                {"tool_calls": [call("write_file", path="log.txt", content=f"{word}\n",
                                     append=True)]},
                {"text": f"Logged {word}."},
            ]  # fmt: skip
            child.write_text(json.dumps({"turns": turns}))
            tables.append(
                f'[agents.writer_{word}]\ndescription = "Logs {word}"\n'
                f'model = "script:{child}"\ntools = ["read_file", "write_file"]\n'
                'approve_tools = ["write_file"]\nmax_model_calls = 6\n'
            )
        (self.config / "keel").mkdir(parents=True)
        (self.config / "keel" / "keel.toml").write_text("\n".join(tables))
        self.lead = tmp / "lead.json"
        fan_out = [call(f"writer_{w}", task=f"Log {w}.") for w in WORDS]
        self.lead.write_text(json.dumps({"turns": [{"tool_calls": fan_out}, {"text": ANSWER}]}))

    def __call__(self, *args: str, failpoints: str = "") -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL")}
        env["XDG_CONFIG_HOME"] = str(self.config)
        if failpoints:
            env["KEEL_FAILPOINTS"] = failpoints
        return subprocess.run(
            [sys.executable, "-m", "keel", *args, "--store", str(self.store)],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            cwd=self.repo,
        )

    def run(self, failpoints: str = "") -> subprocess.CompletedProcess[str]:
        agents = [a for w in WORDS for a in ("--agent", f"writer_{w}")]
        return self(
            "run", "Log the three words.", "--model", f"script:{self.lead}",
            "--repo", str(self.repo), "--allow-writes", *agents, "--json",
            failpoints=failpoints,
        )  # fmt: skip

    def parent(self) -> str:
        db = Store(self.store)
        try:
            (found,) = [r.run_id for r in db.list_runs(50) if r.config.parent_run is None]
        finally:
            db.close()
        return found

    def log(self) -> list[str]:
        path = self.repo / "log.txt"
        return path.read_text().splitlines() if path.exists() else []


def test_a_fan_out_of_three_writers_completes_and_shows_its_tree(tmp_path: Path) -> None:
    tree = Tree(tmp_path)
    done = tree.run()
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert (result["status"], result["answer"]) == ("completed", ANSWER)
    assert sorted(tree.log()) == sorted(WORDS)
    agents = sorted(c["agent"] for c in result["children"])
    assert agents == sorted(f"writer_{w}" for w in WORDS)
    assert all(c["status"] == "completed" for c in result["children"])
    shown = " ".join(tree("show", result["run_id"]).stdout.split())  # wrapped at 80 columns
    assert shown.count("child: run_") == 3
    assert "(of which children: 9 model calls · 6 tool calls)" in shown
    child = result["children"][0]
    as_json = json.loads(tree("show", child["run_id"], "--json").stdout)
    assert as_json["parent"] == {
        "run_id": result["run_id"], "call_id": child["call_id"], "agent": child["agent"],
    }  # fmt: skip
    listing = tree("runs").stdout.splitlines()[1:]  # under the header row
    assert listing[0].startswith(result["run_id"])
    assert sum(1 for line in listing if line.startswith("  └ writer_")) == 3


@pytest.mark.parametrize(("point", "nth"), KILL_POINTS, ids=[f"{p}-{n}" for p, n in KILL_POINTS])
def test_kill_9_in_a_fan_out_then_resume_repeats_no_side_effect_and_completes(
    tmp_path: Path, point: str, nth: int
) -> None:
    tree = Tree(tmp_path)
    killed = tree.run(failpoints=f"{point}:{nth}")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    parent = tree.parent()
    before = {w: tree.log().count(w) for w in WORDS}
    resumed = tree("resume", parent, "--json")
    assert resumed.returncode == 0, resumed.stderr
    result = json.loads(resumed.stdout)
    assert (result["status"], result["answer"]) == ("completed", ANSWER)
    after = tree.log()
    for word in WORDS:
        assert after.count(word) <= 1, (word, after)
        assert after.count(word) >= before[word]
    assert len(result["children"]) == 3
    assert all(c["status"] == "completed" for c in result["children"])


def test_a_fan_out_on_postgres_with_two_workers_one_killed_completes_once(
    tmp_path: Path, pg_url: str
) -> None:
    """`keel submit` a lead with three writers to a Postgres store; worker a takes it and is
    killed while the children run; worker b rescues the lead, which finishes its children from
    the store: every write at most once, the lead completed with three completed children."""
    from pool import Pool

    (tmp_path / "tree").mkdir()
    tree = Tree(tmp_path / "tree")
    for word in WORDS:  # slow children, so the kill lands while they run
        path = tmp_path / "tree" / f"{word}.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "latency_ms": 400}))
    pool = Pool(tmp_path, pg_url, json.loads(tree.lead.read_text()))
    pool.env["XDG_CONFIG_HOME"] = str(tree.config)
    try:
        agents = [a for w in WORDS for a in ("--agent", f"writer_{w}")]
        done = pool.keel(
            "submit", "Log the three words.", "--model", f"script:{tree.lead}",
            "--repo", str(tree.repo), "--allow-writes", "--json", *agents,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        lead_id = json.loads(done.stdout)["run_id"]
        first = pool.worker("a", lease_ttl=2.0)
        children = [child_run_id(lead_id, f"k1_{n}") for n in range(3)]
        pool.wait_for(children, {"running"})
        time.sleep(0.5)  # the children are between their turns
        with psycopg.connect(pg_url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT status FROM keel.runs WHERE run_id = ANY(%s)", (children,)
            ).fetchall()
        assert [status for (status,) in rows] == ["running"] * 3  # killed in the fan-out
        first.send_signal(signal.SIGKILL)
        first.wait()
        pool.worker("b", lease_ttl=2.0)
        pool.wait_for([lead_id], {"completed"}, timeout=120)
        shown = pool.show(lead_id)["run"]
        assert shown["answer"] == ANSWER
        assert len(shown["children"]) == 3
        assert all(c["status"] == "completed" for c in shown["children"])
        log = tree.log()
        for word in WORDS:
            assert log.count(word) <= 1, log
    finally:
        pool.stop_all()


def test_keel_run_events_carries_the_childrens_events_with_their_run_ids(tmp_path: Path) -> None:
    tree = Tree(tmp_path)
    agents = [a for w in WORDS for a in ("--agent", f"writer_{w}")]
    done = tree(
        "run", "Log the three words.", "--model", f"script:{tree.lead}", "--repo",
        str(tree.repo), "--allow-writes", *agents, "--events",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    result = lines[-1]
    assert result["type"] == "result" and result["status"] == "completed"
    children = {c["run_id"] for c in result["children"]}
    theirs = [line for line in lines if "run_id" in line and line["type"] != "result"]
    assert {line["run_id"] for line in theirs} == children
    assert sum(1 for line in theirs if line["type"] == "run_completed") == 3


def test_an_agent_table_without_a_model_runs_its_child_on_the_parents_model(
    tmp_path: Path,
) -> None:
    from keel.assemble import build_agent
    from keel.limits import Limits

    (tmp_path / "notes.md").write_text("notes\n")
    lead = tmp_path / "lead.json"
    lead.write_text(json.dumps({"turns": [
        {"tool_calls": [call("reader", task="Read notes.md.")]}, {"text": "Read."},
    ]}))  # fmt: skip
    settings = {"repo": str(tmp_path), "agents": {"reader": {"description": "Reads", "limits": {}}}}
    agent = build_agent(f"script:{lead}", settings, Limits(), tmp_path / "runs.sqlite", None)
    with agent:
        result = agent.run("q")
        (child,) = result.children
        record = agent.store.get_run(child.run_id)
        assert record is not None and record.config.model == f"script:{lead}"
