"""MCP servers on the command line, with real `keel` processes: `--mcp`, `--mcp-url`,
`[[mcp]]` tables, a server that will not start, and SIGKILL during a side-effecting MCP call
followed by `keel resume` (which starts the server again from the run's saved settings)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from mcp_support import call, calls, http_server, stdio_command

ANSWER = {"text": "Noted; a lease is held by one process."}


class Keel:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.store = tmp_path / "runs.sqlite"
        self.log = tmp_path / "calls.jsonl"
        self.config = tmp_path / "config"
        (self.config / "keel").mkdir(parents=True)
        self.workdir = tmp_path / "work"
        self.workdir.mkdir()

    def env(self, failpoints: str = "") -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "KEEL_FAILPOINTS"}
        env["XDG_CONFIG_HOME"] = str(self.config)
        env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
        if failpoints:
            env["KEEL_FAILPOINTS"] = failpoints
        return env

    def script(self, turns: list[dict[str, Any]]) -> str:
        path = self.tmp / "script.json"
        path.write_text(json.dumps({"turns": turns}))
        return f"script:{path}"

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "keel", *args, "--store", str(self.store)]

    def __call__(
        self, *args: str, failpoints: str = "", timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(*args),
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env(failpoints),
            cwd=self.workdir,
        )

    def server(self, *extra: str) -> str:
        return shlex.join(stdio_command(self.log, *extra))

    def latest_run(self) -> str:
        return self("runs").stdout.splitlines()[1].split()[0]  # under the header row

    def events(self, run_id: str) -> list[dict[str, Any]]:
        shown = self("show", run_id, "--json")
        events: list[dict[str, Any]] = json.loads(shown.stdout)["events"]
        return events


def outcome(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert proc.stdout.strip(), proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def test_an_mcp_server_that_fails_to_start_exits_2_without_a_traceback(tmp_path: Path) -> None:
    keel = Keel(tmp_path)
    model = keel.script([ANSWER])
    proc = keel("run", "q", "--model", model, "--mcp", keel.server("--fail-start"), "--json")
    assert proc.returncode == 2, proc.stderr
    assert "could not be used" in proc.stderr and "Traceback" not in proc.stderr
    assert json.loads(proc.stdout)["error"]["kind"] == "ConfigError"  # --json: stdout too
    proc = keel("run", "q", "--model", model, "--mcp", "/nonexistent/server --flag")
    assert proc.returncode == 2 and "no such program" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("how", ["failpoint", "outside_kill"])
def test_sigkill_during_a_side_effecting_mcp_call_then_resume_is_effect_unknown_and_the_server_saw_one_call(  # noqa: E501
    tmp_path: Path, how: str
) -> None:
    keel = Keel(tmp_path)
    linger = 0.0 if how == "failpoint" else 5.0
    model = keel.script(
        [call("lookup", term="lease"), call("add_note", text="once", linger=linger), ANSWER]
    )
    args = ("run", "Note it.", "--model", model, "--mcp", keel.server(), "--json")
    args += ("--approve-tools", "add_note")
    if how == "failpoint":
        killed = keel(*args, failpoints="inside_side_effect:1")
        assert killed.returncode == -signal.SIGKILL, killed.stderr
    else:
        proc = subprocess.Popen(
            keel.argv(*args),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=keel.env(),
            cwd=keel.workdir,
        )
        deadline = time.monotonic() + 60
        while not calls(keel.log, "add_note") and time.monotonic() < deadline:
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL
    assert len(calls(keel.log, "add_note")) == 1
    run_id = keel.latest_run()

    resumed = keel("resume", run_id, "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert outcome(resumed)["status"] == "completed"
    results = [e for e in keel.events(run_id) if e["type"] == "tool_result"]
    note = next(e for e in results if e["name"] == "add_note")
    assert note["uncertain"] and note["content"].startswith("Effect unknown")
    assert len(calls(keel.log, "add_note")) == 1  # never run again
    assert len(calls(keel.log, "lookup")) == 1


def test_keel_resume_starts_the_runs_mcp_server_again_for_an_approved_call(
    tmp_path: Path,
) -> None:
    keel = Keel(tmp_path)
    model = keel.script([call("add_note", text="approved"), ANSWER])
    paused = keel("run", "Note it.", "--model", model, "--mcp", keel.server(), "--json")
    assert paused.returncode == 3, paused.stderr
    run_id = outcome(paused)["run_id"]
    assert calls(keel.log, "add_note") == []
    assert keel("approve", run_id, "--all").returncode == 0
    resumed = keel("resume", run_id, "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert [c["arguments"]["text"] for c in calls(keel.log, "add_note")] == ["approved"]


def test_mcp_servers_come_from_the_users_keel_toml_never_the_working_directorys(
    tmp_path: Path,
) -> None:
    keel = Keel(tmp_path)
    planted = tmp_path / "planted.jsonl"
    (keel.workdir / "keel.toml").write_text(
        f"[[mcp]]\ncommand = {json.dumps(stdio_command(planted))}\n"
    )
    (keel.config / "keel" / "keel.toml").write_text(
        f'[[mcp]]\nname = "glossary"\ncommand = {json.dumps(stdio_command(keel.log))}\n'
        'approve = ["add_note"]\n'
    )
    model = keel.script([call("lookup", term="lease"), call("add_note", text="x"), ANSWER])
    proc = keel("run", "q", "--model", model, "--json")
    assert proc.returncode == 0, proc.stderr
    assert "ignoring [[mcp]]" in proc.stderr
    assert [c["tool"] for c in calls(keel.log)] == ["lookup", "add_note"]
    assert not planted.exists()  # the working directory's server was never started


def test_keel_run_with_an_mcp_url(tmp_path: Path) -> None:
    keel = Keel(tmp_path)
    with http_server(keel.log) as url:
        model = keel.script([call("lookup", term="lease"), ANSWER])
        proc = keel("run", "q", "--model", model, "--mcp-url", url, "--json")
    assert proc.returncode == 0, proc.stderr
    assert outcome(proc)["tool_calls"] == 1
    assert [c["tool"] for c in calls(keel.log)] == ["lookup"]


def test_a_run_with_mcp_servers_is_not_submitted_to_workers_that_cannot_start_them(
    tmp_path: Path,
) -> None:
    """Workers rebuild a run's tools from its stored settings but start no MCP servers: a
    submitted `--mcp` run would run there without its tools. It is refused, before any server
    starts or any store is opened, and the store's password is never printed."""
    from typer.testing import CliRunner

    from keel.cli.app import app

    marker = tmp_path / "started"
    server = f"{sys.executable} -c \"open({str(marker)!r}, 'w')\""
    for flag in ("--mcp", "--mcp-url"):
        value = server if flag == "--mcp" else "http://127.0.0.1:9/mcp"
        args = ["submit", "q", flag, value, "--store", "postgresql://u:pw-SECRET@127.0.0.1:9/k"]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2, result.output
        assert "MCP" in result.stderr and "keel run" in result.stderr
        assert "pw-SECRET" not in result.output + result.stderr
    assert not marker.exists()
