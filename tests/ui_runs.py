"""Runs for the web view's tests, made by the real command line (`keel run`) with scripted
models, so `keel resume` (what the web view starts after a decision) can continue them."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from keel.cli.app import app

HOSTILE = "<script>alert(1)</script>\x1b[31mred\x1b[0m\x1b]0;owned\x07 \u202eevil"
"""A tool result with HTML, ANSI colour, an OSC title and a bidi override."""


def keel_run(store: Path, repo: Path, script: dict[str, Any], *args: str) -> dict[str, Any]:
    """`keel run --json` with a scripted model, in this process; the run's JSON result."""
    path = store.parent / f"script-{len(list(store.parent.glob('script-*')))}.json"
    path.write_text(json.dumps(script))
    return run_model(store, repo, f"script:{path}", *args)


def run_model(store: Path, repo: Path, model: str, *args: str) -> dict[str, Any]:
    result = CliRunner().invoke(
        app,
        [
            "run",
            "What does the evidence say?",
            "--model",
            model,
            "--repo",
            str(repo),
            "--store",
            str(store),
            "--json",
            *args,
        ],
    )
    assert result.exit_code in (0, 1, 3), result.stderr
    out: dict[str, Any] = json.loads(result.stdout)
    return out


def make_repo(root: Path) -> Path:
    repo = root / "repo"
    repo.mkdir(exist_ok=True)
    (repo / "notes.md").write_text("# Notes\nThe breaker counts identical calls.\n")
    (repo / "evil.md").write_text(HOSTILE)
    return repo


def read(path: str) -> dict[str, Any]:
    return {"tool_calls": [{"name": "read_file", "arguments": {"path": path}}]}


def synthesized_run(store: Path, repo: Path) -> str:
    """Four identical reads with T=5: the fifth turn is the synthesis-only one."""
    script = {"turns": [read("notes.md")] * 4, "on_synthesis": {"text": "It counts calls."}}
    out = keel_run(store, repo, script, "--loop-threshold", "5")
    assert out["synthesized"] == "repeated_tool"
    return str(out["run_id"])


def paused_run(store: Path, repo: Path, answer: str = "Wrote SUMMARY.md.") -> str:
    """A write that needs approval: the run pauses; resumed, it writes and answers."""
    write = {
        "tool_calls": [
            {"name": "write_file", "arguments": {"path": "SUMMARY.md", "content": "summary"}}
        ]
    }
    out = keel_run(store, repo, {"turns": [write, {"text": answer}]}, "--allow-writes")
    assert out["status"] == "awaiting_approval"
    return str(out["run_id"])


def hostile_run(store: Path, repo: Path) -> str:
    """A result and an answer that hold HTML and terminal control sequences."""
    script = {"turns": [read("evil.md"), {"text": "Answer: <script>alert(2)</script>\x1b[2J"}]}
    return str(keel_run(store, repo, script)["run_id"])


def decisions(store: Path, run_id: str) -> tuple[int, str, str]:
    """(approval_decided events, status, state JSON): what a refused request must not change."""
    with contextlib.closing(sqlite3.connect(store)) as db:
        (n,) = db.execute(
            "SELECT count(*) FROM events WHERE run_id = ? AND type = 'approval_decided'",
            (run_id,),
        ).fetchone()
        status, state = db.execute(
            "SELECT status, state FROM runs WHERE run_id = ?", (run_id,)
        ).fetchone()
    return int(n), str(status), str(state)
