"""`--model local` makes its first turn a tool call by default (issue 25): without it the 0.5B
model called no tool and invented the imports it was asked about. The flag stays for other
models, `--no-first-turn-tool` turns the default off, and the choice is recorded with the run
(its limits, and who chose it in the settings) and printed by `keel show`.

The local runs here load the real model (for its tokenizer) but end at once on a deadline of a
millisecond, before any model call: the run is stored with its limits and settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from keel.cli.app import app
from keel.models import first_turn_tool_default
from keel.store import Store

runner = CliRunner()


def _run(tmp_path: Path, model: str, *flags: str) -> tuple[str, Path]:
    store = tmp_path / "runs.sqlite"
    args = ["run", "Which modules does loop.py import?", "--model", model, "--repo", str(tmp_path)]
    args += ["--store", str(store), "--json", "--deadline", "0.001"]
    result = runner.invoke(app, [*args, *flags])
    assert result.exit_code in (0, 1), result.output
    return json.loads(result.stdout)["run_id"], store


def _first_turn(store: Path, run_id: str) -> tuple[bool, object]:
    db = Store(store)
    try:
        record = db.get_run(run_id)
    finally:
        db.close()
    assert record is not None
    return record.config.limits.first_turn_tool, record.config.settings.get("first_turn_tool")


def _script(tmp_path: Path) -> str:
    script = tmp_path / "answer.json"
    script.write_text(json.dumps({"turns": [{"text": "It imports nothing."}]}))
    return f"script:{script}"


def test_first_turn_tool_is_the_default_for_the_local_model_only() -> None:
    assert first_turn_tool_default("local")
    assert first_turn_tool_default("local:/models/other.gguf")
    assert not first_turn_tool_default("openai:gpt-5-mini")
    assert not first_turn_tool_default("script:answer.json")


def test_keel_run_model_local_insists_on_a_first_tool_call_by_default(
    tmp_path: Path, local_model_path: Path
) -> None:
    run_id, store = _run(tmp_path, f"local:{local_model_path}")
    assert _first_turn(store, run_id) == (True, "default")
    shown = runner.invoke(app, ["show", run_id, "--store", str(store)])
    assert "first turn: must call a tool (the default for the local model)" in shown.stdout


def test_no_first_turn_tool_turns_the_local_default_off(
    tmp_path: Path, local_model_path: Path
) -> None:
    run_id, store = _run(tmp_path, f"local:{local_model_path}", "--no-first-turn-tool")
    assert _first_turn(store, run_id) == (False, "given")
    shown = runner.invoke(app, ["show", run_id, "--store", str(store)])
    assert "first turn: may answer without a tool (--no-first-turn-tool)" in shown.stdout


@pytest.mark.parametrize(("flags", "expected"), [((), False), (("--first-turn-tool",), True)])
def test_other_models_keep_the_flag(
    tmp_path: Path, flags: tuple[str, ...], expected: bool
) -> None:
    run_id, store = _run(tmp_path, _script(tmp_path), *flags)
    assert _first_turn(store, run_id) == (expected, "default" if not flags else "given")
