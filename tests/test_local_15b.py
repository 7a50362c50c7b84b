"""The 1.5B embedded model (issue 39) on the README's question, as `make run` asks it with
``--model local:1.5b``: one real run (skips, saying why, when ``keel-runtime[local-1-5b]`` is
not installed). Everything the transport does for the 0.5B is the same code for it: the
grammar-constrained calls, the copied code spans, the short answers, the streaming."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from keel.cli.app import app
from keel.evals.facts import RepoFact, invented, missing

pytest_plugins = ["local_model"]

ROOT = Path(__file__).resolve().parents[1]
QUESTION = "Which modules does the run loop in src/keel/_run/loop.py depend on?"


def test_the_readme_question_on_the_15b_model(local_15b_path: Path, tmp_path: Path) -> None:
    args = ["run", QUESTION, "--model", "local:1.5b", "--repo", str(ROOT)]
    args += ["--max-model-calls", "8", "--first-turn-tool"]
    result = CliRunner().invoke(app, [*args, "--store", str(tmp_path / "r.sqlite"), "--json"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert shown["status"] == "completed", shown
    answer = shown["answer"]
    assert answer and answer.strip()
    assert shown["tool_calls"] >= 1  # it looked before it answered
    expected = RepoFact(kind="imports", path="src/keel/_run/loop.py").expected(ROOT)
    assert invented(expected, answer, ROOT) == [], answer  # its code spans are copied
    assert len(missing(expected, answer)) < len(expected.required), answer  # names some
