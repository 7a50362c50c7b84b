"""The `keel` command line: the JSON contract, exit codes, `show` and `runs`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from keel._run.synthesis import REPEATED_TOOL_CONTROL
from keel.cli.app import app

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
RESULT_KEYS = {
    "run_id",
    "conversation_id",
    "status",
    "answer",
    "evidence",
    "synthesized",
    "cut_off",
    "failure",
    "model_calls",
    "tool_calls",
    "usage",
    "cost_usd",
    "output",
    "partial",
    "gaps",
    "pending_approvals",
}


def script(tmp_path: Path, data: dict[str, Any]) -> str:
    path = tmp_path / "script.json"
    path.write_text(json.dumps(data))
    return f"script:{path}"


def keel(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    (root / "notes.md").write_text("# Notes\nThe breaker counts identical calls.\n")
    return root


def read_notes(n: int) -> list[dict[str, Any]]:
    return [{"tool_calls": [{"name": "read_file", "arguments": {"path": "notes.md"}}]}] * n


def test_run_json_prints_exactly_one_object_with_the_contract_fields(
    tmp_path: Path, repo: Path
) -> None:
    model = script(
        tmp_path, {"turns": read_notes(4), "on_synthesis": {"text": "It counts identical calls."}}
    )
    store = str(tmp_path / "runs.sqlite")
    code, out, _ = keel(
        "run",
        "What does the breaker count?",
        "--model",
        model,
        "--json",
        "--repo",
        str(repo),
        "--store",
        store,
    )
    assert code == 0
    result = json.loads(out)
    assert set(result) == RESULT_KEYS
    assert result["status"] == "completed" and result["synthesized"] == "repeated_tool"
    assert result["answer"] == "It counts identical calls."
    assert result["model_calls"] == 5 and result["tool_calls"] == 4
    assert set(result["usage"]) == {"input_tokens", "output_tokens"}

    code, out, _ = keel("show", result["run_id"], "--json", "--store", store)
    assert code == 0
    shown = json.loads(out)
    assert shown["run"] == result
    requests = [e for e in shown["events"] if e["type"] == "model_request"]
    assert [e["tool_choice"] for e in requests] == [None] * 4 + ["none"]
    assert [e["synthesis"] for e in requests] == [None] * 4 + ["repeated_tool"]
    calls = [e for e in shown["events"] if e["type"] == "tool_call"]
    assert calls[0]["name"] == "read_file" and calls[0]["arguments"] == {"path": "notes.md"}
    assert calls[0]["call_key"] == 'read_file {"path":"notes.md"}'
    results = [e for e in shown["events"] if e["type"] == "tool_result"]
    assert all({"call_key", "is_error", "elided"} <= set(e) for e in results)
    assert REPEATED_TOOL_CONTROL[:30] not in out

    code, out, _ = keel("runs", "--store", store)
    assert code == 0 and result["run_id"] in out


def test_failed_run_exits_1_with_classified_failure(tmp_path: Path, repo: Path) -> None:
    model = script(tmp_path, {"turns": read_notes(3)})
    code, out, _ = keel(
        "run",
        "q",
        "--model",
        model,
        "--json",
        "--repo",
        str(repo),
        "--store",
        str(tmp_path / "s.sqlite"),
        "--loop-threshold",
        "3",
    )
    assert code == 1
    failure = json.loads(out)["failure"]
    assert failure["kind"] == "ToolLoopDetected" and "synthesis" in failure["message"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--loop-threshold", "1"], "at least 2"),
        (["--max-model-calls", "0"], "at least 1"),
        (["--model", "script:/no/such/file.json"], "no/such/file.json"),
        (["--model", "gpt-9"], "unknown model spec"),
        (["--model", "xml:"], "unknown model spec"),
        (["--repo", "/no/such/dir"], "not a folder"),
    ],
)
def test_bad_configuration_exits_2_with_a_clear_message(
    tmp_path: Path, args: list[str], message: str
) -> None:
    model = script(tmp_path, {"turns": [{"text": "x"}]})
    full = ["run", "q", "--store", str(tmp_path / "s.sqlite")]
    if "--model" not in args:
        full += ["--model", model]
    code, _, err = keel(*full, *args)
    assert code == 2
    assert message in err
    assert "Traceback" not in err


def test_malformed_script_is_a_configuration_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"turns": [{"tool_calls": [{"arguments": {}}]}]}')
    code, _, err = keel(
        "run", "q", "--model", f"script:{bad}", "--store", str(tmp_path / "s.sqlite")
    )
    assert code == 2 and "name" in err and "Traceback" not in err


def test_show_unknown_run_exits_2(tmp_path: Path, repo: Path) -> None:
    model = script(tmp_path, {"turns": [{"text": "x"}]})
    store = str(tmp_path / "s.sqlite")
    assert keel("run", "q", "--model", model, "--store", store, "--repo", str(repo))[0] == 0
    code, _, err = keel("show", "run_nope", "--store", store)
    assert code == 2 and "no run run_nope" in err


def test_console_script_prints_answer_and_status(tmp_path: Path, repo: Path) -> None:
    model = script(tmp_path, {"turns": [*read_notes(1), {"text": "The answer."}]})
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "keel",
            "run",
            "q",
            "--model",
            model,
            "--repo",
            str(repo),
            "--store",
            str(tmp_path / "s.sqlite"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "The answer."
    assert "completed" in proc.stderr and "read_file" in proc.stderr
