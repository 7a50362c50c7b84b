"""`keel replay` reads NeMo Gym's rollouts (docs/adr/0064, the second held-out set): each line a
run's OpenAI Responses items with the environment's verdict. Tested on a file NeMo Gym 0.4.0
ships (`tests/data/recordings/README.md`), and on that file's lines rearranged where the file
holds no example (two calls before their outputs, a verdict of partial credit, bad input)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from keel.cli.app import app
from keel.replay.recordings import Recording, Skipped, read_file

ROLLOUTS = Path(__file__).resolve().parent / "data" / "recordings" / "nemo-gym-opencode-math.jsonl"


def _read(path: Path, **kwargs: str) -> tuple[list[Recording], list[Skipped]]:
    skipped: list[Skipped] = []
    return list(read_file(path, skipped, **kwargs)), skipped  # type: ignore[arg-type]


def _lines() -> list[dict[str, object]]:
    return [json.loads(line) for line in ROLLOUTS.read_text().splitlines()]


def _write(tmp_path: Path, rollouts: list[dict[str, object]]) -> Path:
    path = tmp_path / "rollouts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rollouts))
    return path


def test_a_nemo_gym_rollout_is_read_with_its_calls_results_and_verdict() -> None:
    runs, skipped = _read(ROLLOUTS)
    assert skipped == [] and len(runs) == 5
    assert {r.corpus for r in runs} == {"nemo-gym"}
    assert {r.model for r in runs} == {"nvinf/nvidia/qwen/qwen3-next-80b-a3b-instruct"}
    assert all(r.resolved is True for r in runs)  # reward 1.0 each
    assert [len(r.turns) for r in runs] == [1, 1, 1, 3, 4]
    first = runs[0].turns[0][0]
    assert first.tool == "bash" and first.arguments["command"] == 'python3 -c "print(2**100)"'
    assert first.kind == "run" and first.result is not None and not first.empty
    assert first.chars == len("1267650600228229401496703205376\n")
    failed, retried = runs[3].turns[0][0], runs[3].turns[1][0]
    assert failed == retried  # the same command failing alike twice: an identical call
    assert runs[3].turns[2][0].result != failed.result  # the third command printed the number
    assert runs[0].question_chars > 0


def test_calls_asked_together_are_one_turn(tmp_path: Path) -> None:
    rollout = _lines()[3]
    output = rollout["response"]["output"]  # type: ignore[index]
    calls = [i for i in output if i["type"] == "function_call"]
    results = [i for i in output if i["type"] == "function_call_output"]
    rollout["response"]["output"] = calls[:2] + results[:2] + [calls[2], results[2]]  # type: ignore[index]
    (run,), skipped = _read(_write(tmp_path, [rollout]))
    assert skipped == [] and [len(t) for t in run.turns] == [2, 1]
    assert run.turns[0][1].result is not None


def test_the_verdict_is_resolved_where_given_else_read_from_the_reward(tmp_path: Path) -> None:
    lines = _lines()[:4]
    lines[0]["reward"] = 0.0
    lines[1]["reward"] = 0.5
    lines[2]["reward"] = 0.0
    lines[2]["resolved"] = True
    del lines[3]["reward"]
    runs, skipped = _read(_write(tmp_path, lines))
    assert skipped == [] and [r.resolved for r in runs] == [False, None, True, None]


def test_a_rollout_that_cannot_be_read_is_reported_and_skipped(tmp_path: Path) -> None:
    good, nameless, wrong = _lines()[:3]
    nameless["response"]["output"][0].pop("name")  # type: ignore[index]
    wrong["response"]["output"] = "not a list"  # type: ignore[index]
    runs, skipped = _read(_write(tmp_path, [good, nameless, wrong]))
    assert len(runs) == 1
    assert [s.where.rsplit(":", 1)[-1] for s in skipped] == ["2", "3"]
    assert "without a `name`" in skipped[0].reason and "`output`" in skipped[1].reason


def test_another_file_named_a_nemo_gym_rollout_is_refused_by_name() -> None:
    other = Path(__file__).resolve().parent / "data" / "recordings"
    runs, skipped = _read(other / "mini-swe-agent-github_issue.traj.json", format="nemo-gym")
    assert runs == [] and "not a NeMo Gym rollout" in skipped[0].reason


def test_keel_replay_reads_nemo_gym_rollouts_told_apart_by_their_content() -> None:
    for args in ([], ["--format", "nemo-gym"]):
        out = CliRunner().invoke(app, ["replay", str(ROLLOUTS), "--json", *args])
        assert out.exit_code == 0, out.output
        runs = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
        per_run = [r for r in runs if "turns" in r]
        assert [r["turns"] for r in per_run] == [1, 1, 1, 3, 4]
        assert all(r["resolved"] is True and r["corpus"] == "nemo-gym" for r in per_run)
