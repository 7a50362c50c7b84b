"""`keel eval`: the built-in scenarios pass, and each one fails when the rule it guards is
broken (its negative twin); user folders, bad files, --json, --repeat, --model, --store."""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

import keel
import keel._run.batch
import keel._run.resume
import keel._run.synthesis
import keel.evals.scenario
from keel._run.breaker import IdenticalCallBreaker
from keel.evals import builtin_names
from keel.evals.command import eval_command

BUILTIN = [
    "budget_synthesis",
    "changing_page",
    "child_loop",
    "denial",
    "edit_and_reread",
    "evidence_reset_cap",
    "loop",
    "repeated_failing_call",
    "repeated_research",
    "resume_at_threshold",
]

app = typer.Typer(add_completion=False)


@app.callback()
def _root() -> None:
    """A stand-in for keel's own app: `eval` registered the way cli.py registers it."""


app.command("eval")(eval_command)
runner = CliRunner()


def keel_eval(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, ["eval", *args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def eval_json(*args: str) -> tuple[int, dict[str, Any]]:
    code, out, err = keel_eval(*args, "--json")
    assert code in (0, 1), err
    return code, json.loads(out)


def only_row(report: dict[str, Any]) -> dict[str, Any]:
    (scenario,) = report["scenarios"]
    (row,) = scenario["results"]
    return dict(row)


# --- the built-in scenarios pass -------------------------------------------------------------


def test_builtin_scenarios_are_the_seven_of_the_issue_the_two_of_the_replay_and_a_tree() -> None:
    assert builtin_names() == BUILTIN


def test_every_builtin_scenario_passes_and_the_table_says_so() -> None:
    code, out, _ = keel_eval()
    assert code == 0, out
    for name in BUILTIN:
        assert name in out
    headers = ("expected end", "actual end", "model calls", "tool calls", "synthesized", "cost")
    for header in headers:
        assert header in out
    assert f"{len(BUILTIN)} of {len(BUILTIN)} scenarios passed" in out
    assert "FAIL" not in out


def test_builtin_rows_show_the_rule_at_work() -> None:
    code, report = eval_json()
    assert code == 0 and report["passed"] is True
    rows = {s["name"]: s["results"][0] for s in report["scenarios"]}
    assert rows["changing_page"]["actual"] == "answer"
    assert rows["changing_page"]["evidence_resets"] == 3
    assert rows["evidence_reset_cap"]["actual"] == "synthesized: repeated_tool"
    assert rows["loop"]["actual"] == "ToolLoopDetected"
    assert rows["loop"]["page_hits"] == {"/doc": 1, "/other": 0}
    assert rows["repeated_research"]["actual"] == "synthesized: repeated_tool"
    assert rows["repeated_research"]["results_elided"] >= 1
    assert rows["budget_synthesis"]["actual"] == "synthesized: budget"
    assert rows["budget_synthesis"]["model_calls"] == 4


# --- negative twins: break the rule, the scenario must fail ----------------------------------


def never_synthesize(monkeypatch: pytest.MonkeyPatch) -> None:
    """Replace decide_mode wherever the runtime looks it up, so no turn is synthesis-only."""
    original = keel._run.synthesis.decide_mode

    def normal(*_args: Any, **_kwargs: Any) -> keel._run.synthesis.Mode:
        return keel._run.synthesis.NORMAL

    patched = [
        name
        for name, module in list(sys.modules.items())
        if name.startswith("keel") and getattr(module, "decide_mode", None) is original
    ]
    for name in patched:
        monkeypatch.setattr(sys.modules[name], "decide_mode", normal)
    assert patched, "decide_mode is bound nowhere; where does the runtime decide the mode?"


def never_reset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(IdenticalCallBreaker, "settle", lambda self, key, digest, **_: None)


def no_hard_breaker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        IdenticalCallBreaker, "first_tripping_key", lambda self, keys, names=(): None
    )


def ignore_reset_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    original = IdenticalCallBreaker.__init__

    def init(self: IdenticalCallBreaker, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self.reset_cap = 1_000_000

    monkeypatch.setattr(IdenticalCallBreaker, "__init__", init)


def forget_denials(monkeypatch: pytest.MonkeyPatch) -> None:
    """An identical call already denied is asked about again instead of denied again."""
    original = keel._run.batch.ask_approvals

    def ask(parts: Any, batch: Any) -> Any:
        parts.state.denied.clear()
        return original(parts, batch)

    monkeypatch.setattr(keel._run.batch, "ask_approvals", ask)


def resume_without_counters(monkeypatch: pytest.MonkeyPatch) -> None:
    """A resumed run starts its identical-call counters from zero."""
    original = keel._run.resume.load

    def load(store: Any, run_id: str) -> Any:
        point = original(store, run_id)
        point.counters.clear()
        return point

    monkeypatch.setattr(keel._run.resume, "load", load)


Breakage = Callable[[pytest.MonkeyPatch], None]


@pytest.mark.parametrize(
    ("scenario", "breakage", "actual"),
    [
        # The incident itself: without the synthesis turn the 5th fetch trips the breaker.
        ("repeated_research", never_synthesize, "ToolLoopDetected"),
        # Without budget synthesis the last call is spent on a fetch and no answer remains.
        ("budget_synthesis", never_synthesize, "BudgetExhausted"),
        # Without resets the second poll of a progressing page already looks like a loop: the
        # synthesis turn comes, the model polls again in it, and the run fails.
        ("changing_page", never_reset, "ToolLoopDetected"),
        # Without the whole-batch check the batch runs, and the next turn finds no script left.
        ("loop", no_hard_breaker, "ModelError"),
        # Without the cap a page that always changes keeps the run polling.
        ("evidence_reset_cap", ignore_reset_cap, "ModelError"),
        # Forgetting the denial, the identical request asks a person again: the run stays
        # paused with no decision left to apply.
        ("denial", forget_denials, "awaiting approval"),
        # Resumed without its counters, the run keeps researching instead of synthesizing:
        # it spends the turn scripted as "what the model would do next", then runs dry.
        ("resume_at_threshold", resume_without_counters, "ModelError"),
    ],
)
def test_each_scenario_fails_when_its_rule_is_broken(
    scenario: str, breakage: Breakage, actual: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, report = eval_json(scenario)
    assert code == 0, "the scenario must pass before its rule is broken"

    breakage(monkeypatch)
    code, report = eval_json(scenario)
    row = only_row(report)
    assert code == 1
    assert report["passed"] is False and row["passed"] is False
    assert row["actual"] == actual, row["problems"]
    assert any(p.startswith("ended with") for p in row["problems"]), row["problems"]


def test_a_child_that_loops_comes_back_synthesized_and_fails_the_scenario_when_it_cannot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Sub-agents: the looping reader's synthesis answer reaches the lead; without the synthesis
    turn the reader fails ToolLoopDetected, and the scenario says which child missed."""
    code, report = eval_json("child_loop")
    assert code == 0, report
    never_synthesize(monkeypatch)
    code, report = eval_json("child_loop")
    row = only_row(report)
    assert code == 1 and row["passed"] is False
    assert any("of reader ended failed" in p for p in row["problems"]), row["problems"]


def test_broken_hard_breaker_is_seen_at_the_page_server(monkeypatch: pytest.MonkeyPatch) -> None:
    no_hard_breaker(monkeypatch)
    _, report = eval_json("loop")
    row = only_row(report)
    assert row["page_hits"] == {"/doc": 5, "/other": 1}
    assert "requests to /other: 1, expected 0" in row["problems"]


def test_broken_reset_cap_shows_extra_resets_and_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    ignore_reset_cap(monkeypatch)
    _, report = eval_json("evidence_reset_cap")
    row = only_row(report)
    assert row["evidence_resets"] == 4
    assert row["page_hits"] == {"/ticker": 5}
    assert "evidence resets: 4, expected 2" in row["problems"]


def test_failures_are_listed_under_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    never_synthesize(monkeypatch)
    code, out, _ = keel_eval("budget_synthesis", "loop")
    assert code == 1
    assert "budget_synthesis: ended with BudgetExhausted, expected synthesized: budget" in out
    assert "1 of 2 scenarios passed" in out


# --- user scenarios ----------------------------------------------------------------------------

SETTLING_TOML = """
description = "A deploy page settles; polling it ends with a plain answer."
question = "Is the deploy at {base}/deploy done?"
[limits]
loop_threshold = 3
[tools]
names = ["observe_page"]
[[pages]]
path = "/deploy"
kind = "settling"
settle_after = 3
template = "<p>deploy check {n}</p>"
[[script.turns]]
repeat = 3
turn = { tool_calls = [{ name = "observe_page", arguments = { url = "{base}/deploy" } }] }
[[script.turns]]
text = "The deploy settled at check 3."
[expect]
status = "completed"
synthesized = false
evidence_resets = { min = 2, max = 2 }
page_hits = { "/deploy" = { min = 3 } }
answer_contains = ["SETTLED"]
"""

FILES_SCENARIO = {
    "name": "notes_reader",
    "question": "What do the notes say about leases?",
    "files": {"docs/notes.md": "A lease expires when its holder dies.\n"},
    "script": {
        "turns": [
            {"tool_calls": [{"name": "read_file", "arguments": {"path": "docs/notes.md"}}]},
            {"text": "A lease expires when its holder dies."},
        ]
    },
    "expect": {
        "status": "completed",
        "synthesized": False,
        "tool_calls": 1,
        "answer_contains": ["lease expires"],
        "answer_excludes": ["never expires"],
    },
}


@pytest.fixture
def user_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "evals"
    (folder / "nested").mkdir(parents=True)
    (folder / "settling.toml").write_text(SETTLING_TOML)
    (folder / "nested" / "notes.json").write_text(json.dumps(FILES_SCENARIO))
    (folder / "README.md").write_text("not a scenario")
    return folder


def test_a_user_folder_runs_every_scenario_file_in_it(user_folder: Path) -> None:
    code, report = eval_json(str(user_folder))
    assert code == 0, report
    names = [s["name"] for s in report["scenarios"]]
    assert names == ["notes_reader", "settling"]
    assert all(s["passed"] for s in report["scenarios"])


def test_files_builtin_names_and_folders_mix(user_folder: Path) -> None:
    code, report = eval_json("loop", str(user_folder / "settling.toml"))
    assert code == 0
    assert [s["name"] for s in report["scenarios"]] == ["loop", "settling"]
    assert report["scenarios"][1]["source"] == str(user_folder / "settling.toml")


def test_a_user_scenario_that_misses_its_expectation_fails(tmp_path: Path) -> None:
    path = tmp_path / "wrong.toml"
    path.write_text(SETTLING_TOML.replace('["SETTLED"]', '["x1"]'))
    code, out, _ = keel_eval(str(path))
    assert code == 1
    assert "wrong: answer lacks 'x1'" in out


# --- bad input: exit code 2 with the file and the field named --------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (SETTLING_TOML.replace("settle_after = 3", "settle_after = 0"), "pages[0].settle_after"),
        (SETTLING_TOML.replace('kind = "settling"', 'kind = "wobbly"'), "a page's kind is one of"),
        (SETTLING_TOML.replace("[limits]", "[limits]\nloop_treshold = 4"), '"loop_treshold"'),
        (SETTLING_TOML.replace("loop_threshold = 3", "loop_threshold = 1"), "limits: loop thre"),
        (SETTLING_TOML.replace('question = "Is', 'questio = "Is'), 'missing field "question"'),
        (SETTLING_TOML.replace('["observe_page"]', '["observe"]'), "unknown tool(s) observe"),
        (SETTLING_TOML.replace("repeat = 3", "repeat = 0"), "script.turns[0].repeat"),
        (SETTLING_TOML.replace('"/deploy" = { min = 3 }', '"/nope" = 1'), "/nope is not one of"),
        (SETTLING_TOML.replace('status = "completed"', 'status = "done"'), "expect.status"),
        (SETTLING_TOML.replace("synthesized = false", 'failure = "ToolLoopDetected"'), "failure"),
        (SETTLING_TOML + "\n[expect\n", "not valid TOML"),
    ],
)
def test_a_bad_scenario_file_is_a_usage_error_naming_file_and_field(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    code, out, err = keel_eval(str(path))
    assert code == 2
    assert out == ""
    assert str(path) in err
    assert message in err


def test_unknown_names_and_empty_folders_are_usage_errors(tmp_path: Path) -> None:
    code, _, err = keel_eval("no_such_scenario")
    assert code == 2 and "neither a built-in scenario" in err and "changing_page" in err
    code, _, err = keel_eval(str(tmp_path))
    assert code == 2 and "no scenario files" in err


def test_a_scenario_without_a_script_needs_a_model(tmp_path: Path) -> None:
    path = tmp_path / "live.toml"
    path.write_text('question = "Hello?"\n[expect]\nstatus = "completed"\n')
    code, _, err = keel_eval(str(path))
    assert code == 2 and "has no script" in err and "--model" in err


def test_two_files_with_one_name_are_refused(tmp_path: Path) -> None:
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "same.toml").write_text(SETTLING_TOML)
    code, _, err = keel_eval(str(tmp_path))
    assert code == 2 and "two scenarios are named 'same'" in err


# --- output and options ------------------------------------------------------------------------


def test_json_prints_exactly_one_object_with_per_run_rows() -> None:
    code, out, _ = keel_eval("loop", "--json")
    assert code == 0
    report = json.loads(out)
    assert out.strip().count("\n") == 0
    assert set(report) == {"passed", "model", "repeat", "evidence", "scenarios"}
    (scenario,) = report["scenarios"]
    assert scenario["outcomes"] == {"ToolLoopDetected": 1}
    row = scenario["results"][0]
    assert row["failure"]["kind"] == "ToolLoopDetected"
    assert row["run_id"].startswith("run_")
    assert row["unused_turns"] == 0


def test_repeat_runs_each_scenario_n_times_and_counts_outcomes() -> None:
    code, report = eval_json("changing_page", "--repeat", "3")
    assert code == 0
    (scenario,) = report["scenarios"]
    assert scenario["runs"] == scenario["passes"] == 3
    assert scenario["outcomes"] == {"answer": 3}
    assert [r["repeat"] for r in scenario["results"]] == [1, 2, 3]
    code, out, _ = keel_eval("changing_page", "--repeat", "2")
    assert "pass 2/2" in out


def test_repeat_must_be_positive() -> None:
    code, _, err = keel_eval("loop", "--repeat", "0")
    assert code == 2 and "--repeat" in err


def test_a_model_replaces_the_script_and_outcomes_are_counted(tmp_path: Path) -> None:
    """With --model the scenario's script is ignored; without expect_live a run passes when it
    ends with an answer, a classified failure or a pause, and the outcomes are what counts."""
    script = tmp_path / "model.json"
    script.write_text(json.dumps({"turns": [{"text": "The build is still running."}]}))
    code, report = eval_json("changing_page", "--model", f"script:{script}", "--repeat", "2")
    assert code == 0
    (scenario,) = report["scenarios"]
    assert report["model"] == f"script:{script}"
    assert scenario["outcomes"] == {"answer": 2}
    assert all(r["unused_turns"] is None and r["tool_calls"] == 0 for r in scenario["results"])


def test_expect_live_is_checked_with_a_model(tmp_path: Path) -> None:
    scenario = tmp_path / "live.toml"
    scenario.write_text(
        'question = "Status of {base}/s?"\n[[pages]]\npath = "/s"\nbody = "ok"\n'
        '[expect]\nstatus = "completed"\n'
        '[expect_live]\nstatus = "completed"\nanswer_contains = ["green"]\n'
    )
    script = tmp_path / "model.json"
    script.write_text(json.dumps({"turns": [{"text": "All red."}]}))
    code, report = eval_json(str(scenario), "--model", f"script:{script}")
    assert code == 1
    assert only_row(report)["problems"] == ["answer lacks 'green'"]


def test_a_bad_model_spec_is_a_usage_error() -> None:
    code, _, err = keel_eval("loop", "--model", "nonsense")
    assert code == 2 and "unknown model spec" in err


def test_store_keeps_the_runs_for_keel_show(tmp_path: Path) -> None:
    db = tmp_path / "evals.sqlite"
    _, report = eval_json("loop", "--store", str(db))
    run_id = only_row(report)["run_id"]
    store = keel.Store(db)
    try:
        record = store.get_run(run_id)
        assert record is not None and record.status == "failed"
    finally:
        store.close()


def test_list_names_the_scenarios_without_running_them() -> None:
    code, out, _ = keel_eval("--list")
    assert code == 0
    assert [line.split()[0] for line in out.splitlines()] == BUILTIN


def test_a_stuck_run_is_cancelled_at_the_scenario_timeout(tmp_path: Path) -> None:
    path = tmp_path / "stuck.toml"
    path.write_text(
        'question = "Read {base}/slow"\ntimeout = 0.5\n'
        '[tools]\nnames = ["fetch"]\n'
        '[[pages]]\npath = "/slow"\nkind = "slow"\nseconds = 3\n'
        '[[script.turns]]\ntool_calls = [{ name = "fetch", arguments = { url = "{base}/slow" } }]\n'
        '[[script.turns]]\ntext = "done"\n'
        '[expect]\nstatus = "completed"\n'
    )
    code, report = eval_json(str(path))
    row = only_row(report)
    assert code == 1
    assert row["actual"] == "cancelled"
    assert "did not end within 0.5s" in row["problems"][0]
    assert row["seconds"] < 3


def test_the_format_example_in_the_docs_is_a_passing_scenario(tmp_path: Path) -> None:
    doc = keel.evals.scenario.__doc__ or ""
    example = doc.split("::\n", 1)[1].split("\n\nCounts", 1)[0]
    path = tmp_path / "example.toml"
    path.write_text(textwrap.dedent(example))
    code, report = eval_json(str(path))
    assert code == 0, report
