"""Crash safety with real `keel` processes: SIGKILL at step boundaries and inside side effects,
then `keel resume`; approvals across three processes; two resumes racing for one run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ANSWER = "Three notes were appended to log.txt; notes.md says leases expire."


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


SCRIPT = {
    "turns": [
        {"tool_calls": [call("read_file", path="notes.md")]},
        {"tool_calls": [call("write_file", path="log.txt", content="one\n", append=True)]},
        {
            "tool_calls": [
                call("read_file", path="notes.md", start_line=1),
                call("write_file", path="log.txt", content="two\n", append=True),
                call("list_files"),
            ]
        },
        {"tool_calls": [call("write_file", path="log.txt", content="three\n", append=True)]},
        {"text": ANSWER},
    ]
}
EFFECTS = ["one", "two", "three"]

# (failpoint, nth time it is passed): every step boundary, and in and around each side effect.
KILL_POINTS = [
    *[("step_start", n) for n in (1, 2, 3, 4, 5)],
    *[("after_model_response", n) for n in (1, 2, 3, 4, 5)],
    *[("after_journal", n) for n in (1, 2, 3)],
    *[("before_side_effect", n) for n in (1, 2, 3)],
    *[("inside_side_effect", n) for n in (1, 2, 3)],
    *[("after_results", n) for n in (1, 3, 4)],
    *[("after_checkpoint", n) for n in (1, 2, 3, 4)],
]


class Keel:
    """Runs the real command line in a fresh process."""

    def __init__(self, tmp_path: Path, store: str | Path | None = None) -> None:
        self.repo = tmp_path / "repo"
        self.repo.mkdir()
        (self.repo / "notes.md").write_text("# Notes\nLeases expire.\n")
        self.store = store or tmp_path / "runs.sqlite"
        self.script = tmp_path / "script.json"
        self.script.write_text(json.dumps(SCRIPT))

    def __call__(
        self, *args: str, failpoints: str = "", timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k != "KEEL_FAILPOINTS"}
        if failpoints:
            env["KEEL_FAILPOINTS"] = failpoints
        return subprocess.run(
            [sys.executable, "-m", "keel", *args, "--store", str(self.store)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )

    def run(
        self, *extra: str, failpoints: str = "", approve_writes: bool = True
    ) -> subprocess.CompletedProcess[str]:
        approve = ("--approve-tools", "write_file") if approve_writes else ()
        return self(
            "run",
            "What do the notes say? Log three notes.",
            "--model",
            f"script:{self.script}",
            "--repo",
            str(self.repo),
            "--allow-writes",
            *approve,
            "--json",
            *extra,
            failpoints=failpoints,
        )

    def latest_run(self) -> str:
        listing = self("runs").stdout.splitlines()
        return listing[1].split()[0]  # under the header row

    def log(self) -> list[str]:
        path = self.repo / "log.txt"
        return path.read_text().splitlines() if path.exists() else []


def outcome(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert proc.stdout.strip(), proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


@pytest.fixture(params=["sqlite", "postgres"])
def keel_cli(request: pytest.FixtureRequest, tmp_path: Path) -> Keel:
    """The command line over either store: a file, or a new database in the test cluster."""
    if request.param == "sqlite":
        return Keel(tmp_path)
    return Keel(tmp_path, request.getfixturevalue("pg_url"))


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    keel = Keel(tmp_path_factory.mktemp("baseline"))
    result = outcome(keel.run())
    assert result["status"] == "completed" and keel.log() == EFFECTS
    return result


@pytest.mark.parametrize(("point", "nth"), KILL_POINTS, ids=[f"{p}-{n}" for p, n in KILL_POINTS])
def test_killed_run_resumes_to_the_same_end_without_repeating_side_effects(
    keel_cli: Keel, baseline: dict[str, Any], point: str, nth: int
) -> None:
    keel = keel_cli
    killed = keel.run(failpoints=f"{point}:{nth}")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    run_id = keel.latest_run()
    before = keel("show", run_id, "--json")
    recorded = json.loads(before.stdout)["events"]

    resumed = keel("resume", run_id, "--json")
    result = outcome(resumed)
    assert resumed.returncode == 0, resumed.stderr
    for field in ("status", "answer", "synthesized", "failure", "tool_calls"):
        assert result[field] == baseline[field], field

    log = keel.log()
    assert len(log) == len(set(log)), f"a side effect ran twice: {log}"
    events = json.loads(keel("show", run_id, "--json").stdout)["events"]
    uncertain = [e for e in events if e["type"] == "tool_result" and e.get("uncertain")]
    if point in ("after_journal", "before_side_effect", "inside_side_effect"):
        # The interrupted write is answered "effect unknown" and never executed again.
        assert len(uncertain) == 1 and "Effect unknown" in uncertain[0]["content"]
        interrupted = EFFECTS[nth - 1]
        expected = (
            EFFECTS if point == "inside_side_effect" else [e for e in EFFECTS if e != interrupted]
        )
        assert log == expected
    else:
        assert not uncertain and log == EFFECTS
    # Nothing recorded before the kill was lost: the old log is a prefix of the new one.
    assert [(e["seq"], e["type"]) for e in events[: len(recorded)]] == [
        (e["seq"], e["type"]) for e in recorded
    ]


def test_approval_across_processes_keeps_the_synthesis_turn_at_threshold_minus_one(
    keel_cli: Keel,
) -> None:
    keel = keel_cli
    script = {
        "turns": [
            {"tool_calls": [call("read_file", path="notes.md")]},
            {
                "tool_calls": [
                    call("read_file", path="notes.md"),
                    call("write_file", path="log.txt", content="one\n"),
                ]
            },
        ],
        "on_synthesis": {"text": "Synthesized: notes say leases expire; research repeated."},
    }
    keel.script.write_text(json.dumps(script))
    first = keel.run("--loop-threshold", "3", approve_writes=False)
    assert first.returncode == 3, first.stderr
    paused = outcome(first)
    assert paused["status"] == "awaiting_approval"

    shown = json.loads(keel("show", paused["run_id"], "--json").stdout)
    (asked,) = [e for e in shown["events"] if e["type"] == "approval_requested"]
    approved = keel("approve", paused["run_id"], asked["call_id"], "--by", "ana")
    assert approved.returncode == 0 and asked["call_id"] in approved.stdout

    resumed = keel("resume", paused["run_id"], "--json")
    result = outcome(resumed)
    assert resumed.returncode == 0, resumed.stderr
    assert result["status"] == "completed" and result["synthesized"] == "repeated_tool"
    assert keel.log() == ["one"]
    events = json.loads(keel("show", paused["run_id"], "--json").stdout)["events"]
    requests = [e for e in events if e["type"] == "model_request"]
    assert requests[-1]["tool_choice"] == "none" and requests[-1]["synthesis"] == "repeated_tool"
    decided = [e for e in events if e["type"] == "approval_decided"]
    assert decided[0]["by"] == "ana" and decided[0]["approved"] is True
    table = keel("show", paused["run_id"]).stdout
    assert "approval asked" in table and "synthesis turn" in table and "approved by ana" in table


def test_two_resumes_of_one_run_exactly_one_proceeds(keel_cli: Keel) -> None:
    keel = keel_cli
    script = dict(SCRIPT, latency_ms=300)
    keel.script.write_text(json.dumps(script))
    paused = keel.run(approve_writes=False)
    run_id = outcome(paused)["run_id"]
    keel("approve", run_id, "--all")
    env = {k: v for k, v in os.environ.items() if k != "KEEL_FAILPOINTS"}
    command = [sys.executable, "-m", "keel", "resume", run_id, "--json", "--store", str(keel.store)]
    racers = [
        subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        for _ in range(2)
    ]
    done = [(p.wait(timeout=120), *p.communicate()) for p in racers]
    refused = [err for code, _, err in done if code == 2]
    winners = [code for code, _, _ in done if code != 2]
    assert len(refused) == 1, done
    assert "being advanced by another process" in refused[0]
    assert winners[0] in (0, 3), done  # the winner went on (it may pause again for a write)
