"""`keel eval --suite long-runs` (issue 44): runs whose results are many times a 4k, 8k or 32k
window, a turn refused as too long in a provider's words, and facts read at the start asked
for at the end. Every scenario passes, and fails when its rule is broken: a window believed
larger than the model's sends requests past it (files), read-back off makes the model fetch
again and trip the repeat rule (pages), and a refusal the runtime does not recognise ends the
run (every scenario). The pieces: generated documents, seeded refusals, the rewrite for
read-back off, the figures the benchmark (benchmarks/long_runs.py) prints."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

import keel
import keel.transports.policy
import keel.transports.scripted
from keel.errors import ConfigError, ProviderError
from keel.evals import builtin_names
from keel.evals.command import eval_command
from keel.evals.documents import document_html, document_text
from keel.evals.loading import builtin_folder, load_file, parse
from keel.evals.long_run_figures import figures, with_refusal_at, without_read_back
from keel.evals.refusals import WIRES, refusal, refused_turns, with_refusals
from keel.evals.runner import run_once
from keel.evals.scenario import Scenario
from keel.transports.overflow import find_overflow

WINDOWS = {"4k": 4096, "8k": 8192, "32k": 32768}
SCENARIOS = sorted(f"{family}_{w}" for family in ("batches", "files", "pages") for w in WINDOWS)

app = typer.Typer(add_completion=False)
app.callback()(lambda: None)
app.command("eval")(eval_command)


def scenario(name: str) -> Scenario:
    return load_file(builtin_folder("long-runs") / f"{name}.toml")


async def run(s: Scenario, tmp_path: Path) -> tuple[Any, list[Any]]:
    store = keel.Store(tmp_path / "runs.sqlite")
    try:
        row = await run_once(s, model=None, store=store)
        return row, store.events(row.run_id) if row.run_id else []
    finally:
        store.close()


# --- the suite -------------------------------------------------------------------------------


def test_the_long_runs_suite_ends_every_run_with_the_facts_it_read_back() -> None:
    assert builtin_names("long-runs") == SCENARIOS
    done = CliRunner().invoke(app, ["eval", "--suite", "long-runs", "--json"])
    assert done.exit_code == 0, done.stdout
    report = json.loads(done.stdout)
    assert report["passed"] is True
    for s in report["scenarios"]:
        (row,) = s["results"]
        window = WINDOWS[s["name"].rpartition("_")[2]]
        assert row["actual"] == "answer", s["name"]
        assert row["events"]["context_shrunk"] == 1  # the refusal, survived
        assert row["results_elided"] >= 1
        assert row["largest_request"] <= window
        assert "read_result" in " ".join(row["calls"])  # read back, never fetched again


def test_every_scenario_reads_results_five_to_twenty_times_its_window() -> None:
    for name in SCENARIOS:
        s = scenario(name)
        chars = sum(len(text) for text in s.spec.all_files().values())
        chars += sum(p.size_kb * 1024 for p in s.spec.pages if p.kind == "document")
        window = s.limits.context_window
        assert window == WINDOWS[name.rpartition("_")[2]]
        assert 5 <= chars / 3.6 / window <= 20, name


def _window_believed_larger(s: Scenario) -> Scenario:
    """The run takes the model for one of a million tokens (a wrong --context-window): nothing
    is fitted to the window the scenario's model has."""
    return replace(s, limits=replace(s.limits, context_window=1_000_000))


RULES: list[tuple[str, Any, str]] = [
    *((f"files_{w}", _window_believed_larger, "tokens of the largest request") for w in WINDOWS),
    *((f"pages_{w}", without_read_back, "ended with synthesized: repeated_tool") for w in WINDOWS),
]


@pytest.mark.parametrize(("name", "broken", "problem"), RULES)
async def test_each_long_runs_scenario_fails_with_its_rule_broken(
    tmp_path: Path, name: str, broken: Any, problem: str
) -> None:
    row, _ = await run(broken(scenario(name)), tmp_path)
    assert not row.passed
    assert any(p.startswith(problem) for p in row.problems), row.problems


def _unrecognised(error: ProviderError, body: object = None) -> ProviderError:
    return error  # a runtime that does not know the provider's words for "too long"


@pytest.mark.parametrize("name", SCENARIOS)
async def test_each_long_runs_scenario_fails_when_the_refusal_is_not_recognised(
    tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(keel.transports.scripted, "as_overflow", _unrecognised)
    monkeypatch.setattr(keel.transports.policy, "as_overflow", _unrecognised)
    row, _ = await run(scenario(name), tmp_path)
    assert not row.passed
    assert row.actual == "ModelError", row.problems


# --- the pieces ------------------------------------------------------------------------------


def test_a_generated_document_is_the_same_every_time_with_its_facts_where_planted() -> None:
    facts = [("The code word is HALIBUT.", 0.0), ("It closes on 14 March.", 1.0)]
    text = document_text(20_000, seed=7, title="Report", facts=facts)
    assert text == document_text(20_000, seed=7, title="Report", facts=facts)
    assert text != document_text(20_000, seed=8, title="Report", facts=facts)
    assert 20_000 <= len(text) < 21_000
    lines = [line for line in text.splitlines() if line]
    assert lines.index("The code word is HALIBUT.") < 5
    assert lines[-2] == "It closes on 14 March."  # before the last paragraph
    assert "HALIBUT" not in document_text(20_000, seed=7, title="Report")
    page = document_html(20_000, seed=7, title="Report", facts=facts)
    assert "<p>It closes on 14 March.</p>" in page and page.startswith("<html>")


@pytest.mark.parametrize("wire", WIRES)
def test_each_wires_refusal_is_recognised_as_a_context_overflow_naming_the_window(
    wire: str,
) -> None:
    error = refusal(wire, 8192)["error"]  # type: ignore[arg-type]
    assert error["status"] == 400
    found = find_overflow(error["status"], error["message"])
    assert found is not None
    if wire != "llama.cpp":  # llama.cpp's words name no numbers
        assert found.limit == 8192 and found.requested == 9011


def test_refusals_come_at_seeded_turns_each_turn_once_from_after_on() -> None:
    picked = refused_turns(10, 3, seed=4, after=2)
    assert picked == refused_turns(10, 3, seed=4, after=2)
    assert len(set(picked)) == 3 and min(picked) >= 2
    script = {"turns": [{"text": str(n)} for n in range(10)]}
    out = with_refusals(script, ["openai", "anthropic", "llama.cpp"], 4, 4096, after=2)["turns"]
    errors = [n for n, turn in enumerate(out) if "error" in turn]
    assert [out[n + 1]["text"] for n in errors] == [str(t) for t in picked]
    with pytest.raises(ValueError, match="need 3 turns"):
        refused_turns(4, 3, seed=1, after=2)


def test_a_scenario_refuses_refusals_without_a_window_and_facts_past_its_documents() -> None:
    base: dict[str, Any] = {
        "question": "q",
        "script": {"turns": [{"text": "a"}]},
        "expect": {"status": "completed"},
    }
    with pytest.raises(ConfigError, match=r"limits\.context_window"):
        parse({**base, "refusals": {"wordings": ["openai"]}}, "x.toml", default_name="x")
    with pytest.raises(ConfigError, match="need as many turns"):
        parse(
            {**base, "limits": {"context_window": 4096}, "refusals": {"wordings": ["openai"] * 2}},
            "x.toml",
            default_name="x",
        )
    folder = {"path": "r/{n}.md", "count": 2, "size_kb": 1, "facts": [{"document": 3, "text": "t"}]}
    with pytest.raises(ConfigError, match="document 3 of 2"):
        parse({**base, "documents": [folder]}, "x.toml", default_name="x")
    with pytest.raises(ConfigError, match="no event type 'context_shrank'"):
        parse(
            {**base, "expect": {"status": "completed", "events": {"context_shrank": 1}}},
            "x.toml",
            default_name="x",
        )


def test_read_back_off_fetches_again_the_call_that_made_each_result_it_would_read() -> None:
    s = scenario("pages_4k")
    off = without_read_back(s)
    assert off.limits.read_back is False and s.limits.read_back is True
    calls = [c for t in (off.spec.script or {})["turns"] for c in t.get("tool_calls", [])]
    assert [c["name"] for c in calls].count("read_result") == 0
    assert [c["arguments"]["url"] for c in calls[-3:]] == ["{base}/brief/1"] * 3


async def test_the_figures_count_fetches_of_elided_results_and_the_synthesis_they_cause(
    tmp_path: Path,
) -> None:
    s = scenario("pages_4k")
    row, events = await run(s, tmp_path / "on")
    on = figures(s, row, events)
    off_scenario = without_read_back(s)
    row, events = await run(off_scenario, tmp_path / "off")
    off = figures(off_scenario, row, events)
    assert (on.answered, on.facts, on.refetched, on.refetch_synthesis) == (True, True, 0, False)
    assert (off.answered, off.facts, off.refetched, off.refetch_synthesis) == (True, False, 3, True)
    assert on.shrinks == off.shrinks == 1
    assert 5 <= on.results_per_window <= 20 and on.tokens > 0


async def test_a_refusal_moved_to_another_turn_is_the_only_one(tmp_path: Path) -> None:
    moved = with_refusal_at(scenario("batches_8k"), 3)
    assert moved.spec.refusals is None
    turns = (moved.spec.script or {})["turns"]
    assert [n for n, t in enumerate(turns) if "error" in t] == [3]
    row, _ = await run(moved, tmp_path)
    assert row.actual == "answer" and row.events["context_shrunk"] == 1
