"""`keel eval --suite loop-tiers` (issue 38, item 5): a scripted model for each repeat tier
and one for the nudge (docs/adr/0050). Each scenario ends as its tier makes it end, and fails
when that tier (or the nudge) is off: its negative twin."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

import keel
from keel.evals import builtin_names
from keel.evals.command import eval_command
from keel.evals.loading import builtin_folder, load_file
from keel.evals.runner import run_once

SCENARIOS = ["alternation_reads", "nudge_changes_course", "same_error_pages", "same_result_paths"]

app = typer.Typer(add_completion=False)
app.callback()(lambda: None)
app.command("eval")(eval_command)


def test_the_loop_tiers_suite_ends_each_scenario_as_its_tier_makes_it() -> None:
    assert builtin_names("loop-tiers") == SCENARIOS
    done = CliRunner().invoke(app, ["eval", "--suite", "loop-tiers", "--json"])
    assert done.exit_code == 0, done.stdout
    report = json.loads(done.stdout)
    assert report["passed"] is True
    rows: dict[str, dict[str, Any]] = {s["name"]: s["results"][0] for s in report["scenarios"]}
    outcome = {
        name: (row["actual"], row["tool_calls"], row["nudges"]) for name, row in rows.items()
    }
    assert outcome == {
        "same_result_paths": ("synthesized: repeated_tool", 3, 0),  # three paths, T = 4
        "alternation_reads": ("synthesized: repeated_tool", 6, 0),  # A B A B A B, T = 5
        "same_error_pages": ("synthesized: repeated_tool", 4, 0),  # four failures, T = 5
        "nudge_changes_course": ("answer", 3, 1),  # the note at T-2, then an answer
    }
    assert rows["alternation_reads"]["unused_turns"] == 1  # the seventh read, never made


@pytest.mark.parametrize(
    ("name", "off", "problem"),
    [
        ("same_result_paths", {"repeat_same_result": False}, "ended with"),
        ("alternation_reads", {"repeat_alternation": False}, "tool calls: 7, expected 6"),
        ("same_error_pages", {"repeat_same_error": False}, "ended with"),
        ("nudge_changes_course", {"nudge": False}, "nudges: 0, expected 1"),
    ],
)
async def test_each_loop_tiers_scenario_fails_with_its_rule_off(
    tmp_path: Path, name: str, off: dict[str, bool], problem: str
) -> None:
    scenario = load_file(builtin_folder("loop-tiers") / f"{name}.toml")
    store = keel.Store(tmp_path / "runs.sqlite")
    try:
        kept = await run_once(scenario, model=None, store=store)
        broken = replace(scenario, limits=replace(scenario.limits, **off))
        row = await run_once(broken, model=None, store=store)
    finally:
        store.close()
    assert kept.passed, kept.problems
    assert not row.passed
    assert any(p.startswith(problem) for p in row.problems), row.problems
