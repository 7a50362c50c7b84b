"""`keel eval --suite repo-questions-20` (issue 39): twenty questions about this repository, of
many shapes, written before any model was measured on them. Each checker reads its answer
from the code when the evaluation runs (`keel.evals.facts`, `keel.evals.code_facts`); here each
is tried on a hand-written right answer and a hand-written wrong one, against this repository,
and the new shapes on a small repository of their own, to show they follow the code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from keel.cli.app import app
from keel.evals.facts import RepoFact
from keel.evals.grading import repo_problems
from keel.evals.loading import builtin_names, resolve

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()

ANSWERS: dict[str, tuple[str, str]] = {
    # scenario: (a right answer, a wrong answer)
    "q01_ensure_model_raises": (
        "It raises ConfigError (when the cache folder cannot be made).",
        "It raises FileNotFoundError when a part is missing.",
    ),
    "q02_resolve_model_raises": (
        "A ConfigError saying the spec is unknown.",
        "It raises ValueError.",
    ),
    "q03_models_prints": (
        "It prints `default: SPEC (source)`, then `its window: ...`, then `local model file: "
        "PATH (size)`, then `context windows (keel/data/windows.toml, as of DATE):` with a row "
        "per model and `any model not listed`, and `(--context-window or context_window in "
        "keel.toml sets a model's window)`.",
        "It prints the default model.",
    ),
    "q04_eval_table_prints": (
        "A line like `3 of 5 scenarios passed: FAILED`.",
        "It prints the total time of the evaluation.",
    ),
    "q05_model_timeout_default": (
        "model_timeout defaults to 600.0 seconds.",
        "The default is 300 seconds.",
    ),
    "q06_max_model_calls_default": (
        "By default 50 model calls (max_model_calls = 50).",
        "max_model_calls is 8 by default.",
    ),
    "q07_n_ctx_default": (
        "n_ctx defaults to 8192 tokens.",
        "n_ctx defaults to 4096.",
    ),
    "q08_ensure_model_tests": (
        "tests/test_local_model.py tests ensure_model.",
        "tests/test_weights.py tests it.",
    ),
    "q09_turn_grammar_tests": (
        "tests/test_local_grammar.py covers turn_grammar.",
        "It is covered by tests/test_grammar_rules.py.",
    ),
    "q10_agent_resume_methods": (
        "Agent.resume, Agent.aresume, Agent.start_resume and Agent.stream_resume.",
        "Agent.resume and Agent.restart.",
    ),
    "q11_run_failure_kinds": (
        "ToolLoopDetected, BudgetExhausted, DeadlineExceeded, ContextExhausted, ModelError, "
        "EmptyModelTurn, InvalidOutput, RescuesExhausted, StoreUnavailable, HookFailed and "
        "EndedByHook.",
        "ToolLoopDetected, BudgetExhausted, DeadlineExceeded, ModelError and EmptyModelTurn.",
    ),
    "q12_loop_threshold_checked": (
        "In src/keel/limits.py, in Limits.__post_init__.",
        "In src/keel/_run/breaker.py.",
    ),
    "q13_max_search_matches": (
        "In src/keel/tools/files.py: MAX_SEARCH_MATCHES = 200.",
        "In src/keel/tools/search.py, it is 100.",
    ),
    "q14_default_suite": (
        'DEFAULT_SUITE = "rules", in src/keel/evals/suites.py.',
        'It is "repo-questions", set in src/keel/evals/command.py.',
    ),
    "q15_gateway_imports": (
        "keel.errors, keel.limits, keel.messages, keel.transports (liveness), "
        "keel.transports.base and keel.transports.policy.",
        "keel.errors, keel.limits and keel.messages.",
    ),
    "q16_attempt_parameters": (
        "attempt(transport, request, limits, remaining).",
        "attempt(transport, request).",
    ),
    "q17_grading_exports": (
        "GRADES, Grade, echoed_controls, grade and repo_problems.",
        "grade and Grade.",
    ),
    "q18_limits_rejects_with": (
        "ConfigError, with a message naming the setting.",
        "It raises ValueError.",
    ),
    "q19_tool_error_subclasses": (
        "EffectUnknown subclasses ToolError.",
        "ToolTimeout and ToolDenied.",
    ),
    "q20_deadline_checked": (
        "In src/keel/_run/budgets.py: time.time() >= self.deadline_at.",
        "In src/keel/_run/deadline.py.",
    ),
}


def test_the_suite_has_twenty_questions_each_with_a_fact() -> None:
    names = builtin_names("repo-questions-20")
    assert len(names) == 20 and set(names) == set(ANSWERS)
    scenarios = resolve([], "repo-questions-20")
    assert all(s.spec.fact is not None for s in scenarios)
    kinds = {s.spec.fact.kind for s in scenarios if s.spec.fact is not None}
    assert len(kinds) == 12  # many shapes, not twenty of one


@pytest.mark.parametrize("name", sorted(ANSWERS))
def test_each_checker_takes_the_right_answer_and_refuses_the_wrong_one(name: str) -> None:
    (scenario,) = resolve([name], "repo-questions-20")
    assert scenario.spec.fact is not None
    expected = scenario.spec.fact.expected(ROOT)
    right, wrong = ANSWERS[name]
    assert repo_problems(expected, right, ROOT) == [], right
    assert repo_problems(expected, wrong, ROOT) != [], wrong


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    (tmp_path / "tests").mkdir()
    (tmp_path / "src" / "pkg" / "mod.py").write_text(
        "import typer\n\n"
        "class Base(Exception): ...\n"
        "class Oops(Base): ...\n"
        "class Other(Exception): ...\n\n"
        "class Thing:\n"
        "    def resume(self): ...\n"
        "    def aresume(self): ...\n"
        "    def stop(self): ...\n\n"
        "def work(x, *, size=64, name='a'):\n"
        "    if x > LIMIT:\n"
        "        raise Oops('too big')\n"
        "    typer.echo(f'done: {x} items')\n"
        "    print('total', x)\n"
    )
    (tmp_path / "tests" / "test_mod.py").write_text("from pkg.mod import work\n")
    (tmp_path / "tests" / "helpers.py").write_text("from pkg.mod import work\n")
    return tmp_path


def labels(fact: RepoFact, repo: Path) -> list[str]:
    return [label for label, _ in fact.expected(repo).required]


def test_the_new_shapes_follow_the_code(repo: Path) -> None:
    mod = "src/pkg/mod.py"
    assert labels(RepoFact(kind="raises", path=mod, name="work"), repo) == ["Oops"]
    assert labels(RepoFact(kind="prints", path=mod, name="work"), repo) == ["items", "total"]
    assert labels(RepoFact(kind="subclasses", path=mod, name="Base"), repo) == ["Oops"]
    methods = RepoFact(kind="methods", path=mod, name="Thing", item="resume")
    assert labels(methods, repo) == ["resume", "aresume"]
    default = RepoFact(kind="parameter_default", path=mod, name="work", item="size")
    assert labels(default, repo) == ["size = 64"]
    tested = RepoFact(kind="tested_by", name="work").expected(repo)
    assert tested.required[0][1] == ("tests/test_mod.py", "test_mod.py")  # not helpers.py
    compared = RepoFact(kind="compared_in", path="src", name="LIMIT").expected(repo)
    assert compared.required[0][1] == (mod, "pkg/mod.py")
    (repo / mod).write_text("def work(x, size=32):\n    raise KeyError(x)\n")
    assert labels(RepoFact(kind="raises", path=mod, name="work"), repo) == ["KeyError"]
    assert labels(default, repo) == ["size = 32"]


def test_the_suite_runs_from_the_command_line_against_a_scripted_answer(tmp_path: Path) -> None:
    script = tmp_path / "answer.json"
    right = ANSWERS["q19_tool_error_subclasses"][0]
    script.write_text(json.dumps({"turns": [{"text": right}], "on_synthesis": {"text": right}}))
    args = ["eval", "--suite", "repo-questions-20", "--model", f"script:{script}", "--json"]
    result = runner.invoke(app, [*args, "--repo", str(ROOT), "q19_tool_error_subclasses"])
    assert result.exit_code in (0, 1), result.output
    (row,) = json.loads(result.stdout)["scenarios"][0]["results"]
    assert row["grade"] == "right", row
