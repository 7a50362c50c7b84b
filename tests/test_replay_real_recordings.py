"""`keel replay` reads the files other runtimes really write (docs/adr/0064), each tested on a
file the real software wrote (`tests/data/recordings/README.md` names each one's source): a
SWE-agent `.traj` read as one (it was read as an OpenHands run of no turns), mini-swe-agent's
trajectories, OpenTelemetry's console exporter output and OTLP JSON carrying OpenInference
spans; plus a Claude Code session whose first line is a `file-history-snapshot`, an OpenHands
`events/` folder as one run, and a recording's own names scrubbed in the table."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from keel.cli.app import app
from keel.replay.openhands import read_folder
from keel.replay.recordings import Recording, Skipped, read_file

DATA = Path(__file__).resolve().parent / "data" / "recordings"
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "replay"


def _read(path: Path, **kwargs: str) -> tuple[list[Recording], list[Skipped]]:
    skipped: list[Skipped] = []
    return list(read_file(path, skipped, **kwargs)), skipped  # type: ignore[arg-type]


def _replay(*args: str) -> list[dict[str, object]]:
    out = CliRunner().invoke(app, ["replay", *args, "--json"])
    assert out.exit_code == 0, out.output
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def test_a_swe_agent_traj_is_read_as_swe_agent_steps() -> None:
    (run,), skipped = _read(DATA / "swe-agent-klieret-test-repo-i1.traj")
    assert (
        skipped == [] and run.corpus == "SWE-agent" and run.id == "swe-agent-klieret-test-repo-i1"
    )
    calls = [turn[0] for turn in run.turns]
    assert [c.tool for c in calls] == ["find_file", "open", "edit", "bash", "submit"]
    assert [c.kind for c in calls] == ["read", "read", "write", "run", "submit"]
    assert calls[0].arguments == {"command": 'find_file "missing_colon.py"'}
    assert all(c.result is not None and not c.empty for c in calls)


def test_a_swe_agent_traj_is_refused_by_name_as_another_format() -> None:
    runs, skipped = _read(DATA / "swe-agent-klieret-test-repo-i1.traj", format="openhands")
    assert runs == [] and "SWE-agent .traj" in skipped[0].reason


def test_a_mini_swe_agent_trajectory_is_read_with_its_empty_outputs_marked() -> None:
    (run,), skipped = _read(DATA / "mini-swe-agent-github_issue.traj.json")
    assert skipped == [] and run.corpus == "mini-swe-agent" and len(run.turns) == 10
    calls = [turn[0] for turn in run.turns]
    assert calls[4].arguments["command"].startswith("sed -i ")  # type: ignore[index]
    assert calls[4].kind == "write" and calls[4].empty  # <returncode>0</returncode>, nothing else
    assert calls[0].kind == "read" and not calls[0].empty  # <returncode>1</returncode>: it failed
    assert calls[-1].tool == "submit"


def test_the_console_exporter_s_spans_one_after_another_are_one_trace() -> None:
    (run,), skipped = _read(DATA / "otel-console-openinference.txt")
    assert skipped == [] and run.model == "gpt-4o-mini" and len(run.turns) == 5
    assert {turn[0].tool for turn in run.turns} == {"find_file"}
    assert run.turns[0][0].arguments == {"query": "JsonParser"}


def test_openinference_spans_replay_to_their_same_result_loop() -> None:
    for name in ("otel-console-openinference.txt", "otel-otlp-openinference.json"):
        (run,) = _replay(str(DATA / name), "--threshold", "4", "--tiers", "same_result")
        assert (run["synthesis_after"], run["tier"]) == (2, "same_result"), name
        (off,) = _replay(str(DATA / name), "--threshold", "4", "--tiers", "none")
        assert off["synthesis_after"] is None, name


def test_a_claude_code_session_is_detected_whatever_its_first_record(tmp_path: Path) -> None:
    snapshot = {
        "type": "file-history-snapshot",
        "messageId": "00000000-0000-4000-8000-000000000001",
        "snapshot": {"messageId": "00000000-0000-4000-8000-000000000001", "trackedFileBackups": {}},
        "isSnapshotUpdate": False,
    }
    session = tmp_path / "session.jsonl"
    session.write_text(
        json.dumps(snapshot) + "\n" + (FIXTURES / "claude-code-session.jsonl").read_text()
    )
    (run,), skipped = _read(session)
    (plain,), _ = _read(FIXTURES / "claude-code-session.jsonl")
    assert skipped == [] and run.corpus == "claude-code" and run.turns == plain.turns


def test_an_openhands_events_folder_replays_as_one_run(tmp_path: Path) -> None:
    events = json.loads((FIXTURES / "openhands-sdk-events.json").read_text())
    folder = tmp_path / "conversation-1" / "events"
    folder.mkdir(parents=True)
    for n, event in enumerate(events):
        (folder / f"event-{n:05d}-{event['id']}.json").write_text(json.dumps(event))
    (whole,), _ = _read(FIXTURES / "openhands-sdk-events.json")
    skipped: list[Skipped] = []
    (run,) = list(read_folder(folder, skipped))
    assert skipped == [] and run.id == "conversation-1" and run.turns == whole.turns
    by_dir = _replay(str(folder), "--tiers", "same_result")
    by_files = _replay(*sorted(str(p) for p in folder.iterdir()))
    assert len(by_dir) == len(by_files) == 1 and by_dir[0]["synthesis_after"] == 5


def test_keel_replay_scrubs_a_recording_s_own_names_from_its_table(tmp_path: Path) -> None:
    line = {
        "id": "run-1",
        "corpus": "evil\x1b]52;c;cm0gLXJmIH4=\x07corpus",
        "model": "[bold]m\x1b[2J\u202eodel",
        "turns": [[{"tool": "ls", "arguments": {}, "result_digest": "a", "kind": "read"}]],
    }
    path = tmp_path / "runs.jsonl"
    path.write_text(json.dumps(line) + "\n")
    out = CliRunner().invoke(app, ["replay", str(path)])
    assert out.exit_code == 0
    shown = out.stdout_bytes
    assert b"\x1b" not in shown and b"\x07" not in shown and "\u202e".encode() not in shown
    assert b"[bold]m" in shown  # printed as written, never read as markup
