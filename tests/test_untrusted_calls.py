"""Attacks from outside a run (tracker issue 20, ADR 0030), each written as it worked before:

- a provider's call ids were trusted as unique, so a reused id inherited an earlier approval,
  one approval covered two calls of a batch, and after a crash one call's effect stood in for
  another's;
- a decision could be decided again, so a denied write ran once someone else approved it.

Keel now gives every call an id of its own (`k<step>_<n>`) and keeps the provider's for the
wire; a decision, once recorded, is final.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

import keel
from hostile_model import HostileModel
from keel.records import ApprovalDecided

WRITE = "write_file"
T = TypeVar("T")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    return root


@pytest.fixture
def store(tmp_path: Path) -> keel.Store:
    return keel.Store(tmp_path / "runs.sqlite")


def agent(model: HostileModel, repo: Path, store: keel.Store, **options: Any) -> keel.Agent:
    tools = [*keel.file_tools(repo), *keel.write_tools(repo)]
    return keel.Agent(
        "openai-chat:hostile", base_url=model.base_url, tools=tools, store=store, **options
    )


def write(call_id: str, path: str, content: str) -> tuple[str, str, dict[str, Any]]:
    return (call_id, WRITE, {"path": path, "content": content, "append": True})


def stored(path: Path, read: Callable[[keel.Store], T]) -> T:
    """What `read` finds in the store file at `path`, opened for it and closed again."""
    db = keel.Store(path)
    try:
        return read(db)
    finally:
        db.close()


def cli(store: Path, *args: str, failpoints: str = "") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "KEEL_FAILPOINTS"}
    if failpoints:
        env["KEEL_FAILPOINTS"] = failpoints
    return subprocess.run(
        [sys.executable, "-m", "keel", *args, "--store", str(store)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def run_cli(
    store: Path, model: HostileModel, repo: Path, *extra: str, failpoints: str = ""
) -> subprocess.CompletedProcess[str]:
    return cli(
        store,
        "run",
        "Write the notes.",
        "--model",
        "openai-chat:hostile",
        "--base-url",
        model.base_url,
        "--repo",
        str(repo),
        "--allow-writes",
        "--json",
        *extra,
        failpoints=failpoints,
    )


# -- decisions -------------------------------------------------------------------------------


def test_a_denial_is_final_and_a_later_approval_is_refused_naming_it(
    repo: Path, tmp_path: Path
) -> None:
    path = tmp_path / "runs.sqlite"
    turns = [[write("call_1", "notes.md", "overwritten\n")], "I left notes.md alone."]
    with HostileModel(turns) as model:
        paused = run_cli(path, model, repo)
        assert paused.returncode == 3, paused.stderr
        out = json.loads(paused.stdout)
        run_id, call_id = out["run_id"], out["pending_approvals"][0]["call_id"]
        denied = cli(path, "deny", run_id, call_id, "--reason", "not that file", "--by", "alice")
        assert denied.returncode == 0, denied.stderr
        approved = cli(path, "approve", run_id, call_id, "--by", "mallory")
        assert approved.returncode == 2, "a second decision overwrote the denial"
        message = approved.stderr.strip()
        assert "\n" not in message and message.startswith("keel: ")
        assert "already denied by alice" in message and "not that file" in message
        assert " UTC" in message  # when it was decided
        resumed = cli(path, "resume", run_id, "--json")
    assert json.loads(resumed.stdout)["status"] == "completed"
    assert not (repo / "notes.md").exists()
    events = stored(path, lambda db: db.events(run_id))
    decided = [e for e in events if isinstance(e, ApprovalDecided)]
    assert [(e.by, e.approved) for e in decided] == [("alice", False)]
