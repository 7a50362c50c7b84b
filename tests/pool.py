"""Helpers for the tests of many machines: real `keel submit`, `keel worker` and `keel`
processes over one throwaway Postgres database (`tests/postgres.py`)."""

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

KEEL = [sys.executable, "-m", "keel"]


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


class Pool:
    """A repo, a script, and the command line over one Postgres store."""

    def __init__(self, tmp_path: Path, url: str, script: dict[str, Any]) -> None:
        self.url = url
        self.repo = tmp_path / "repo"
        self.repo.mkdir()
        (self.repo / "notes.md").write_text("# Notes\nLeases expire.\n")
        self.script = tmp_path / "script.json"
        self.script.write_text(json.dumps(script))
        self.logs = tmp_path / "logs"
        self.logs.mkdir()
        self.workers: list[subprocess.Popen[str]] = []
        self.env = {k: v for k, v in os.environ.items() if k != "KEEL_FAILPOINTS"}

    def keel(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*KEEL, *args, "--store", self.url],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env,
        )

    def submit(self, question: str = "What do the notes say?", *extra: str) -> str:
        done = self.keel(
            "submit", question, "--model", f"script:{self.script}", "--repo", str(self.repo),
            "--allow-writes", "--json", *extra,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        run_id: str = json.loads(done.stdout)["run_id"]
        return run_id

    def worker(
        self, name: str, *, concurrency: int = 4, lease_ttl: float = 2.0
    ) -> subprocess.Popen[str]:
        log = (self.logs / f"{name}.log").open("a")
        proc = subprocess.Popen(
            [*KEEL, "worker", "--store", self.url, "--name", name, "--concurrency",
             str(concurrency), "--lease-ttl", str(lease_ttl)],
            stdout=log, stderr=log, text=True, env=self.env,
        )  # fmt: skip
        self.workers.append(proc)
        return proc

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text()

    def show(self, run_id: str) -> dict[str, Any]:
        done = self.keel("show", run_id, "--json")
        assert done.returncode == 0, done.stderr
        shown: dict[str, Any] = json.loads(done.stdout)
        return shown

    def status(self, run_id: str) -> str:
        return str(self.show(run_id)["run"]["status"])

    def wait_for(self, run_ids: list[str], statuses: set[str], timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        pending = list(run_ids)
        with psycopg.connect(self.url, autocommit=True) as conn:
            while pending:
                rows = conn.execute("SELECT run_id, status FROM keel.runs").fetchall()
                now = dict(rows)
                pending = [r for r in pending if now.get(r) not in statuses]
                if not pending:
                    return
                assert time.monotonic() < deadline, f"still not {statuses}: {pending[:5]}"
                time.sleep(0.05)

    def stop_all(self) -> None:
        for proc in self.workers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.workers:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
