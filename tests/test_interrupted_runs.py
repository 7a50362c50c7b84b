"""Cancellation is an interruption, not an end (issue 26, ADR 0036): a cancelled run (Ctrl-C in
`keel run`, a cancelled task) is resumed by `keel resume`, a side effect that was in flight is
answered "effect unknown" (never run twice), `keel runs` and `keel show` say how to continue
it, and Ctrl-C says at once what it does."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

import keel
from keel.cli.app import app

runner = CliRunner()
EFFECT = {"tool_calls": [{"name": "send", "arguments": {"to": "ana"}}]}


def scripted(turns: list[dict[str, Any]]) -> keel.ScriptedTransport:
    return keel.ScriptedTransport.from_dict({"turns": turns})


async def cancelled_mid_effect(store: keel.Store) -> tuple[str, list[str]]:
    """A run cancelled while its side-effecting tool is in flight; what the tool did."""
    sent: list[str] = []
    entered = asyncio.Event()

    @keel.tool(effect="side_effecting")
    async def send(to: str) -> str:
        """Send a note to someone."""
        sent.append(to)
        entered.set()
        await asyncio.sleep(60)
        return "sent"

    agent = keel.Agent(
        scripted([EFFECT, {"text": "Sent, I think."}]),
        tools=[send],
        store=store,
        approve_tools=["send"],
    )
    handle = agent.start("Send ana a note.")
    await asyncio.wait_for(entered.wait(), 10)
    handle.cancel()
    result = await handle
    assert result.status == "cancelled"
    return result.run_id, sent


async def test_a_cancelled_run_is_resumed_and_its_in_flight_effect_is_effect_unknown(
    tmp_path: Path,
) -> None:
    """`keel resume` said `has already ended (cancelled); nothing to resume`."""
    store = keel.Store(tmp_path / "runs.sqlite")
    run_id, sent = await cancelled_mid_effect(store)

    @keel.tool(effect="side_effecting")
    def send(to: str) -> str:
        """Send a note to someone."""
        sent.append(to)
        return "sent"

    again = keel.Agent(
        scripted([EFFECT, {"text": "Sent, I think."}]), tools=[send], store=store,
        approve_tools=["send"],
    )  # fmt: skip
    resumed = await again.aresume(run_id)
    assert resumed.status == "completed" and resumed.answer == "Sent, I think."
    assert sent == ["ana"]  # never run twice
    results = [e for e in store.events(run_id) if e.type == "tool_result"]
    assert [r.uncertain for r in results] == [True]  # type: ignore[attr-defined]
    assert "Effect unknown" in results[0].content  # type: ignore[attr-defined]
    store.close()


async def test_keel_runs_and_keel_show_say_a_cancelled_run_can_be_resumed(
    tmp_path: Path,
) -> None:
    path = tmp_path / "runs.sqlite"
    store = keel.Store(path)
    run_id, _ = await cancelled_mid_effect(store)
    store.close()
    listed = runner.invoke(app, ["runs", "--store", str(path)])
    assert listed.exit_code == 0, listed.stderr
    resume = f"keel resume {run_id} --store {path}"
    assert f"cancelled runs were interrupted, not ended; continue one with: {resume}" in (
        listed.stdout
    )
    shown = runner.invoke(app, ["show", run_id, "--store", str(path)])
    assert shown.exit_code == 0, shown.stderr
    assert f"continue it with: {resume}" in shown.stdout


def test_ctrl_c_in_keel_run_says_so_and_keel_resume_finishes_the_run(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "notes.md").write_text("".join(f"line {n}\n" for n in range(40)))
    reads = [
        {"tool_calls": [{"name": "read_file", "arguments": {"path": "notes.md",
                                                              "start_line": n + 1}}]}
        for n in range(12)
    ]  # fmt: skip
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": [*reads, {"text": "Read."}], "latency_ms": 100}))
    store = tmp_path / "runs.sqlite"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KEEL", "OPENAI"))}
    env["XDG_CONFIG_HOME"] = str(tmp_path / "config")
    base = [sys.executable, "-m", "keel"]
    proc = subprocess.Popen(
        [*base, "run", "Read the notes.", "--model", f"script:{script}", "--repo", str(repo),
         "--store", str(store)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and statuses(store) != ["running"]:
            time.sleep(0.05)
        time.sleep(0.4)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err
    assert "keel: SIGINT: interrupting run run_" in err
    assert "continue it with: keel resume run_" in err
    assert statuses(store) == ["cancelled"]
    run_id = err.split("continue it with: keel resume ")[1].split()[0]
    done = subprocess.run(
        [*base, "resume", run_id, "--store", str(store)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "Read."
    assert statuses(store) == ["completed"]


def statuses(store: Path) -> list[str]:
    if not store.exists():
        return []
    try:
        with sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=5) as db:
            return [str(row[0]) for row in db.execute("SELECT status FROM runs")]
    except sqlite3.Error:
        return []
