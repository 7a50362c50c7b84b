"""`keel eval --suite repo-questions` (issue 25): five questions about the repository under
evaluation, answers graded right / wrong / cut off against facts read from its code when the
evaluation runs (`keel.evals.facts`), never written into the scenario; and no answer may repeat
a synthesis control's sentences (issue 26). The model here is scripted; the local model's
figures come from `keel eval --model local --repeat 3` (ADR 0043)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from keel._run.synthesis import BUDGET_CONTROL
from keel.cli.app import app
from keel.evals.facts import RepoFact
from keel.evals.grading import echoed_controls, repo_problems
from keel.evals.loading import builtin_names, resolve

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()
LOOP = "src/pkg/_run/loop.py"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    (tmp_path / "src" / "pkg" / "_run").mkdir(parents=True)
    (tmp_path / LOOP).write_text(
        "import asyncio\nfrom pkg._run.step import take_step\nfrom pkg.errors import Oops\n"
        "from . import breaker\n\ndef run(question, *, limit=5, **extra):\n    pass\n"
    )
    (tmp_path / "src" / "pkg" / "_run" / "step.py").write_text("MAX_STEPS = 20\n")
    (tmp_path / "src" / "pkg" / "errors.py").write_text("__all__ = ['Oops']\n")
    return tmp_path


def _eval(
    repo: Path, tmp_path: Path, answer: str, *names: str, repeats: int = 0
) -> dict[str, object]:
    """`answer` as the first turn, or, after `repeats` identical reads, as the synthesis turn's."""
    script = tmp_path / "answer.json"
    read = {"name": "read_file", "arguments": {"path": "src/keel/tools/files.py", "end_line": 3}}
    turns = [{"tool_calls": [read]}] * repeats if repeats else [{"text": answer}]
    script.write_text(json.dumps({"turns": turns, "on_synthesis": {"text": answer}}))
    args = ["eval", "--suite", "repo-questions", "--model", f"script:{script}", "--json"]
    result = runner.invoke(app, [*args, "--repo", str(repo), *names])
    assert result.exit_code in (0, 1), result.output
    return json.loads(result.stdout)


def test_the_expected_answer_is_read_from_the_code_when_the_evaluation_runs(repo: Path) -> None:
    fact = RepoFact(kind="imports", path=LOOP)
    before = [label for label, _ in fact.expected(repo).required]
    assert before == ["pkg._run.step", "pkg.errors", "pkg._run"]  # `from . import` resolved
    (repo / LOOP).write_text("from pkg.limits import Limits\n")
    assert [label for label, _ in fact.expected(repo).required] == ["pkg.limits"]


def test_each_kind_of_fact_comes_from_the_code(repo: Path) -> None:
    def labels(**fields: str) -> list[str]:
        return [label for label, _ in RepoFact.model_validate(fields).expected(repo).required]

    assert labels(kind="parameters", path=LOOP, name="run") == ["question", "limit", "extra"]
    assert labels(kind="defined_in", path="src", name="MAX_STEPS") == [
        "src/pkg/_run/step.py",
        "MAX_STEPS = 20",
    ]
    assert labels(kind="exports", path="src/pkg/errors.py") == ["Oops"]


def test_an_answer_that_names_every_module_and_invents_none_is_right(repo: Path) -> None:
    expected = RepoFact(kind="imports", path=LOOP).expected(repo)
    answer = "It imports asyncio, pkg._run.step, pkg.errors and pkg._run (breaker)."
    assert repo_problems(expected, answer, repo) == []


def test_an_answer_that_misses_a_module_or_invents_one_is_wrong(repo: Path) -> None:
    expected = RepoFact(kind="imports", path=LOOP).expected(repo)
    missing = repo_problems(expected, "It imports pkg._run.step and pkg._run.", repo)
    assert missing == ["answer does not name pkg.errors"]
    invented = repo_problems(
        expected, "pkg._run.step, pkg.errors, pkg._run and pkg.loop, in src/pkg/loop.py", repo
    )
    assert invented == [
        "answer names what the repository does not hold: src/pkg/loop.py, pkg.loop"
    ]


def test_an_answer_that_repeats_a_synthesis_control_is_caught() -> None:
    assert echoed_controls("The loop imports the breaker. " + BUDGET_CONTROL) != []
    assert echoed_controls("Answer the question now, in this last reply, from the tool") != []
    assert echoed_controls("The loop imports the breaker; the step is unknown.") == []


def test_the_suite_is_five_questions_about_this_repository() -> None:
    names = builtin_names("repo-questions")
    assert len(names) == 5 and "loop_imports" in names
    scenarios = resolve([], "repo-questions")
    for scenario in scenarios:
        assert scenario.spec.fact is not None and scenario.spec.script is None
        assert scenario.spec.fact.expected(ROOT).required  # true of the code as it is now
    readme = {s.name: s.spec.question for s in scenarios}["loop_imports"]
    assert readme == "Which modules does the run loop in src/keel/_run/loop.py depend on?"


def test_keel_eval_grades_each_run_right_wrong_or_cut_off(repo: Path, tmp_path: Path) -> None:
    right = "MAX_READ_LINES is defined in src/keel/tools/files.py; its value is 2000."
    report = _eval(ROOT, tmp_path, right, "read_lines_constant")
    (scenario,) = report["scenarios"]  # type: ignore[misc]
    assert scenario["grades"] == {"right": 1, "wrong": 0, "cut off": 0}
    assert scenario["results"][0]["problems"] == []
    wrong = _eval(ROOT, tmp_path, "It is defined in src/keel/constants.py.", "read_lines_constant")
    (scenario,) = wrong["scenarios"]  # type: ignore[misc]
    assert scenario["grades"] == {"right": 0, "wrong": 1, "cut off": 0}
    problems = scenario["results"][0]["problems"]
    assert "answer names what the repository does not hold: src/keel/constants.py" in problems


def test_a_right_answer_written_in_the_synthesis_turn_is_right_and_counted_as_synthesized(
    tmp_path: Path,
) -> None:
    """Only a limit that cuts the answer short (the output limit, a failure) is "cut off": the
    synthesis turn is how the runtime gets an answer, and one that ends on its own is graded on
    what it says; the table counts the synthesized runs beside the grades."""
    right = "MAX_READ_LINES is defined in src/keel/tools/files.py; its value is 2000."
    report = _eval(ROOT, tmp_path, right, "read_lines_constant", repeats=4)
    (scenario,) = report["scenarios"]  # type: ignore[misc]
    assert scenario["grades"] == {"right": 1, "wrong": 0, "cut off": 0}
    assert scenario["results"][0]["synthesized"] == "repeated_tool"


def test_a_repo_question_outside_the_repository_says_where_to_run_it(tmp_path: Path) -> None:
    script = tmp_path / "answer.json"
    script.write_text(json.dumps({"turns": [{"text": "?"}]}))
    args = ["eval", "--suite", "repo-questions", "--model", f"script:{script}"]
    result = runner.invoke(app, [*args, "--repo", str(tmp_path), "loop_imports"])
    assert result.exit_code == 2
    assert "run the repo-questions suite in Keel's own repository" in result.stderr


def test_the_table_counts_right_wrong_and_cut_off(tmp_path: Path) -> None:
    script = tmp_path / "answer.json"
    script.write_text(json.dumps({"turns": [{"text": "The default is 5."}]}))
    args = ["eval", "--suite", "repo-questions", "--model", f"script:{script}", "--repeat", "2"]
    result = runner.invoke(app, [*args, "--repo", str(ROOT), "loop_threshold_default"])
    assert result.exit_code == 0, result.output
    rows = [line.replace("│", " ").replace("┃", " ").split() for line in result.stdout.splitlines()]
    header = ["question", "right", "wrong", "cut", "off", "runs", "synthesized"]
    assert any(row[: len(header)] == header for row in rows)  # then the evidence columns
    assert ["loop_threshold_default", "2", "0", "0", "2", "0", "2/2", "0/2"] in rows
