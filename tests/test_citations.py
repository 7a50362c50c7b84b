"""Citations (ADR 0053, named so by ADR 0058): every tool result is citable by an id the model
sees beside it (`[r1]`, in the order results enter the history), and each answer is checked
against the record when it is written: unknown ids listed, quotes found (white space
normalised) in the stored text of the result they cite, elided or not, paths and URLs matched to
the results that read them. `--citations require` gives exactly one more turn, then keeps the
answer partial with its failures as gaps."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import keel
from keel._run.context import labelled
from keel.agent import DEFAULT_SYSTEM_PROMPT
from keel.citations import Source, check_answer, check_output, normalise
from keel.records import EvidenceRejected, RunCompleted
from keel.transports.scripted import ScriptedTransport
from support import call, run_script

LEASE = "The lease is renewed\n    every ttl/3 seconds by the owner."


@keel.tool
def read_file(path: str) -> str:
    """Read a file of the repository."""
    return f"{path}: {LEASE}"


@keel.tool
def big_read(path: str) -> str:
    """Read a large file."""
    return f"{path} begins. " + "filler words here. " * 300 + "The breaker trips at T."


def source(ref: str, text: str, key: str = 'read_file {"path":"lease.md"}') -> Source:
    return Source(ref, key.split()[0], key, text)


# -- the check itself (pure) -------------------------------------------------------------------


def test_a_quote_not_in_its_result_fails() -> None:
    checked = check_answer('The docs say "the lease never expires" [r1].', [source("r1", LEASE)])
    assert checked.quotes_checked == 0 and not checked.passed
    (failed,) = checked.quotes_failed
    assert (failed.quote, failed.refs, failed.reason) == (
        "the lease never expires",
        ("r1",),
        "not_in_result",
    )
    assert checked.failures() == [
        'the quote "the lease never expires" [r1] is in no result it cites'
    ]


def test_a_quote_with_different_white_space_passes() -> None:
    answer = 'It says "The lease is renewed every   ttl/3\nseconds" [r1].'
    checked = check_answer(answer, [source("r1", LEASE)])
    assert checked.passed and checked.quotes_checked == 1 and not checked.quotes_failed
    assert checked.quotes[0].found_in == "r1"


def test_an_unknown_id_is_listed() -> None:
    answer = 'The lease is renewed every ttl/3 seconds [r1]. The breaker trips at T [r7], "x" [r9].'
    checked = check_answer(answer, [source("r1", LEASE)])
    assert checked.unknown_ids == ("r7", "r9") and checked.cited == ("r1",)
    assert [f.reason for f in checked.quotes_failed] == ["unknown_id"]
    assert not checked.passed


def test_uncited_factual_sentences_are_counted_and_questions_and_labels_are_not() -> None:
    answer = (
        "## Findings\n"
        "- The lease is renewed every ttl/3 seconds [r1].\n"
        "- The owner renews it without asking anyone.\n"
        "Sources:\n"
        "What remains open?\n"
        "```\nprint('code is not a sentence at all here')\n```\n"
    )
    checked = check_answer(answer, [source("r1", LEASE)])
    assert (checked.sentences, checked.uncited_sentences) == (2, 1)


def test_paths_and_urls_are_matched_to_the_results_that_read_them() -> None:
    results = [
        source("r1", LEASE, 'read_file {"path":"src/keel/_run/lease.py"}'),
        source("r2", "a page", 'fetch {"url":"https://example.org/lease"}'),
    ]
    answer = (
        "See _run/lease.py and https://example.org/lease [r1][r2]; README.md was not read, "
        "nor https://example.com/other."
    )
    checked = check_answer(answer, results)
    assert dict(checked.sources) == {
        "https://example.org/lease": ("r2",),
        "https://example.com/other": (),
        "_run/lease.py": ("r1",),
        "README.md": (),
    }
    assert checked.unread_sources == ("https://example.com/other", "README.md")


def test_a_structured_citation_field_is_checked() -> None:
    output = {
        "summary": "The lease is renewed by its owner.",
        "citations": [
            {"claim": "renewal", "result_id": "r1", "quote": "renewed\n every ttl/3 seconds"},
            {"claim": "expiry", "result_id": "r1", "quote": "expires after ttl"},
            {"claim": "breaker", "result_id": "r4", "quote": "trips"},
            {"claim": "owner", "result_id": ""},
        ],
    }
    checked = check_output(output, [source("r1", LEASE)])
    assert checked.quotes_checked == 1
    assert [(f.quote, f.reason) for f in checked.quotes_failed] == [
        ("expires after ttl", "not_in_result"),
        ("trips", "unknown_id"),
    ]
    assert checked.unknown_ids == ("r4",) and checked.cited == ("r1",)
    assert (checked.sentences, checked.uncited_sentences) == (5, 2)  # the summary, the ""


_NO_QUOTE_MARK = st.characters(blacklist_characters='"\u201c\u201d', blacklist_categories=["Cs"])


@settings(max_examples=300, deadline=None)
@given(st.text(_NO_QUOTE_MARK, min_size=1, max_size=200), st.data())
def test_any_substring_of_a_stored_result_quoted_with_its_id_checks(
    stored: str, data: st.DataObject
) -> None:
    start = data.draw(st.integers(0, len(stored) - 1))
    end = data.draw(st.integers(start + 1, len(stored)))
    quoted = stored[start:end]
    if not normalise(quoted):
        return  # quotation marks around white space quote nothing
    results = [source("r1", "an unrelated result"), source("r2", stored)]
    checked = check_answer(f'The result reads "{quoted}" [r2].', results)
    assert checked.quotes_checked == 1 and not checked.quotes_failed
    assert checked.quotes[0].found_in == "r2"


# -- in a run ------------------------------------------------------------------------------------


async def test_every_result_is_shown_with_its_id_and_the_answer_checked_in_the_result() -> None:
    answer = 'The lease is renewed "every ttl/3 seconds" [r2], says _run/lease.py [r1].'
    out = await run_script(
        {
            "turns": [
                call("read_file", path="README.md"),
                call("read_file", path="_run/lease.py"),
                {"text": answer},
            ]
        },
        [read_file],
    )
    results = [i for i in out.requests[-1].items if isinstance(i, keel.ToolResult)]
    assert [r.content[:5] for r in results] == ["[r1] ", "[r2] "]
    assert results[1].content == f"[r2] _run/lease.py: {LEASE}"
    evidence = out.result.evidence
    assert evidence is not None
    assert evidence["cited"] == ["r2", "r1"] and evidence["quotes_checked"] == 1
    assert evidence["quotes_failed"] == [] and evidence["unknown_ids"] == []
    assert evidence["sources"] == {"_run/lease.py": ["r2"]}
    assert out.result.to_dict()["evidence"] == evidence
    (completed,) = out.of_type(RunCompleted)
    assert completed.evidence == evidence and not out.result.partial


async def test_a_quote_from_an_elided_result_is_checked_against_the_stored_text() -> None:
    answer = '"The breaker trips at T." [r1] and "renewed every ttl/3" [r4]'
    script = {
        "turns": [call("big_read", path=f"f{n}.md") for n in range(3)]
        + [call("read_file", path="lease.md"), {"text": answer}]
    }
    out = await run_script(script, [big_read, read_file], context_tokens=2000)
    last = out.requests[-1].items
    pointer = next(i for i in last if isinstance(i, keel.ToolResult) and i.elided)
    assert pointer.content.startswith("[r1] [elided to save context: the result of big_read")
    assert "The breaker trips" not in pointer.content
    evidence = out.result.evidence
    assert evidence is not None and evidence["quotes_checked"] == 2, evidence


def test_an_elided_results_pointer_keeps_its_id() -> None:
    from keel._run.context import ContextBuilder
    from keel.tokens import EstimatingCounter

    builder = ContextBuilder("s", (), EstimatingCounter(), budget=300, elide_min_tokens=10)
    builder.append(keel.UserMessage("q"))
    for n in range(3):
        call_id = f"k{n}"
        builder.append(keel.AssistantMessage(None, ()))
        result = keel.ToolResult(
            call_id, "read", f"read {n}", "x " * 400, size=800, digest="0" * 64
        )
        builder.append(result)
    request, elided = builder.build()
    shown = [i for i in request.items if isinstance(i, keel.ToolResult)]
    assert elided and [s.content[:5] for s in shown] == ["[r1] ", "[r2] ", "[r3] "]
    assert shown[0].elided and shown[0].content.startswith("[r1] [elided")
    assert [ref for ref, _ in builder.results()] == ["r1", "r2", "r3"]
    assert labelled(shown[2], "r9").content.startswith("[r9] [r3]")


@keel.tool(requires_approval=True)
def fetch(url: str) -> str:
    """Download a web page as text."""
    return f"page {url}: the loop checkpoints every step"


async def test_ids_survive_resume(tmp_path: Path) -> None:
    answer = 'It "checkpoints every step" [r2] and reads "ttl/3 seconds" [r1].'
    turns = [
        call("read_file", path="a.md"),
        call("fetch", url="https://example.org/a"),
        {"text": answer},
    ]
    store = keel.Store(tmp_path / "runs.sqlite")

    def agent(**options: Any) -> tuple[keel.Agent, ScriptedTransport]:
        transport = ScriptedTransport.from_dict({"turns": turns}, record=True)
        return keel.Agent(transport, tools=[read_file, fetch], store=store, **options), transport

    straight, straight_model = agent(approve_tools=["fetch"])
    done = await straight.arun("Q")
    paused_agent, _ = agent()
    paused = await paused_agent.arun("Q")
    assert paused.status == "awaiting_approval"
    store.decide(paused.run_id, paused.pending_approvals[0].call_id, approved=True, by="ana")
    resumed_agent, resumed_model = agent()
    resumed = await resumed_agent.aresume(paused.run_id)
    assert resumed.status == done.status == "completed"
    # the resumed run's last request is the uninterrupted one's, ids and all
    assert resumed_model.requests[-1].items == straight_model.requests[-1].items
    assert resumed.evidence == done.evidence
    assert resumed.evidence is not None and resumed.evidence["quotes_checked"] == 2


async def test_ids_continue_across_follow_up_questions(tmp_path: Path) -> None:
    store = keel.Store(tmp_path / "runs.sqlite")

    def agent(*turns: dict[str, Any]) -> tuple[keel.Agent, ScriptedTransport]:
        transport = ScriptedTransport.from_dict({"turns": list(turns)}, record=True)
        return keel.Agent(transport, tools=[read_file], store=store), transport

    first_agent, _ = agent(call("read_file", path="a.md"), {"text": "A [r1]."})
    first = await first_agent.arun("Q1")
    answer = 'Both say "ttl/3 seconds": "renewed every ttl/3" [r1] and "b.md: The lease" [r2].'
    follow_agent, follow_model = agent(call("read_file", path="b.md"), {"text": answer})
    follow = await follow_agent.aask(first.run_id, "Q2")
    results = [i for i in follow_model.requests[-1].items if isinstance(i, keel.ToolResult)]
    assert [r.content[:17] for r in results] == ["[r1] a.md: The le", "[r2] b.md: The le"]
    assert follow.evidence is not None
    assert follow.evidence["quotes_checked"] == 2 and follow.evidence["cited"] == ["r1", "r2"]


async def test_require_gives_exactly_one_more_turn_and_then_marks_the_answer_partial() -> None:
    wrong = 'The lease "never expires" [r1], says [r5].'
    still_wrong = 'The lease "expires after a day" [r1].'
    out = await run_script(
        {"turns": [call("read_file", path="a.md"), {"text": wrong}, {"text": still_wrong}]},
        [read_file],
        citations="require",
    )
    assert out.result.status == "completed" and out.result.answer == still_wrong
    assert out.result.model_calls == 3 and out.result.partial
    assert out.result.gaps == ('the quote "expires after a day" [r1] is in no result it cites',)
    (rejected,) = out.of_type(EvidenceRejected)
    assert rejected.text == wrong
    control = out.requests[2].volatile[-1]
    assert control == rejected.feedback and "r5 names no result" in control
    assert '"never expires" [r1]' in control
    assert out.requests[2].items[-1] == keel.AssistantMessage(wrong)  # kept in the history
    assert all(control not in r.volatile for r in out.requests[:2])
    completed = out.of_type(RunCompleted)[0]
    assert completed.partial and completed.gaps == out.result.gaps


async def test_require_passes_an_answer_that_checks_without_another_turn() -> None:
    out = await run_script(
        {"turns": [call("read_file", path="a.md"), {"text": '"ttl/3 seconds" [r1]'}]},
        [read_file],
        citations="require",
    )
    assert (
        out.result.model_calls == 2 and not out.result.partial and not out.of_type(EvidenceRejected)
    )


async def test_require_corrected_answer_is_kept_whole_and_not_partial() -> None:
    out = await run_script(
        {
            "turns": [
                call("read_file", path="a.md"),
                {"text": '"never" [r1]'},
                {"text": '"every ttl/3 seconds" [r1]'},
            ]
        },
        [read_file],
        citations="require",
    )
    assert out.result.model_calls == 3 and not out.result.partial and out.result.gaps == ()
    assert out.result.evidence is not None and out.result.evidence["passed"] is True


class _Crash(Exception):
    """Stands in for the process dying right after a checkpoint."""


async def test_a_resumed_run_repeats_the_require_turns_control(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control is state: a run that stops after the rejection, before the model answered
    the one more turn, sends the same request, control and all, on resume."""
    from keel._run import turns as turns_module

    store = keel.Store(tmp_path / "runs.sqlite")
    script = {
        "turns": [
            call("read_file", path="a.md"),
            {"text": '"never" [r1]'},
            {"text": '"ttl/3 seconds" [r1]'},
        ]
    }
    passed = 0

    def crash_at_the_third_attempt(name: str) -> None:
        nonlocal passed
        if name == "after_checkpoint":
            passed += 1
            if passed == 3:
                raise _Crash

    monkeypatch.setattr(turns_module, "failpoint", crash_at_the_third_attempt)
    first = ScriptedTransport.from_dict(script, record=True)
    limits = keel.Limits(citations="require")
    agent = keel.Agent(first, tools=[read_file], store=store, limits=limits, lease_ttl=0.2)
    with pytest.raises(_Crash):
        await agent.arun("Q")
    monkeypatch.undo()
    (record,) = store.list_runs()
    assert record.state.evidence_feedback is not None and record.state.evidence_retries == 1
    await asyncio.sleep(0.3)  # the dead process's lease runs out
    again = ScriptedTransport.from_dict(script, record=True)
    resumed = await keel.Agent(again, tools=[read_file], store=store).aresume(record.run_id)
    assert resumed.status == "completed" and not resumed.partial, resumed.failure
    straight = ScriptedTransport.from_dict(script, record=True)
    await keel.Agent(
        straight,
        tools=[read_file],
        store=keel.Store(":memory:"),
        limits=keel.Limits(citations="require"),
    ).arun("Q")
    sent, expected = again.requests[0], straight.requests[2]
    assert (sent.items, sent.volatile) == (expected.items, expected.volatile)  # ids, control
    assert again.requests[0].volatile[-1].startswith("Correct your last answer")


async def test_structured_answers_citations_are_checked_in_a_run() -> None:
    schema = {
        "type": "object",
        "properties": {
            "answer": {"type": "string"},
            "citations": {"type": "array", "items": {"type": "object"}},
        },
        "required": ["answer"],
    }
    text = json.dumps(
        {
            "answer": "Renewed by the owner.",
            "citations": [
                {"claim": "c", "result_id": "r1", "quote": "every ttl/3 seconds"},
                {"claim": "d", "result_id": "r1", "quote": "once a year"},
            ],
        }
    )
    transport = ScriptedTransport.from_dict(
        {"turns": [call("read_file", path="a.md"), {"text": text}]}, record=True
    )
    agent = keel.Agent(
        transport, tools=[read_file], store=keel.Store(":memory:"), output_type=schema
    )
    result = await agent.arun("Q")
    assert result.evidence is not None and result.evidence["quotes_checked"] == 1
    assert [f["quote"] for f in result.evidence["quotes_failed"]] == ["once a year"]


async def test_off_checks_nothing_but_the_ids_are_still_shown() -> None:
    out = await run_script(
        {"turns": [call("read_file", path="a.md"), {"text": '"never" [r7]'}]},
        [read_file],
        citations="off",
    )
    assert out.result.evidence is None and "evidence" not in out.result.to_dict()
    results = [i for i in out.requests[-1].items if isinstance(i, keel.ToolResult)]
    assert results[0].content.startswith("[r1] ")


def test_the_citations_policy_is_an_option_of_keel_run_and_keel_toml() -> None:
    from keel.run_options import OPTIONS

    (option,) = [o for o in OPTIONS if o.name == "citations"]
    assert option.default == "report" and option.flag_name == "--citations"
    assert (option.env_name, option.toml_key) == ("KEEL_CITATIONS", "citations")
    assert keel.Limits().citations == "report"
    try:
        keel.Limits(citations="always")  # type: ignore[arg-type]
    except keel.ConfigError as error:
        assert "off, report, require" in str(error)
    else:
        raise AssertionError("an unknown policy was accepted")


def test_the_prompt_and_the_synthesis_controls_ask_for_bracketed_ids_and_quotes() -> None:
    from keel._run.synthesis import BUDGET_CONTROL, DEADLINE_CONTROL, REPEATED_TOOL_CONTROL

    assert "[r1]" in DEFAULT_SYSTEM_PROMPT and "double quotation marks" in (DEFAULT_SYSTEM_PROMPT)
    for control in (REPEATED_TOOL_CONTROL, BUDGET_CONTROL, DEADLINE_CONTROL):
        assert "in brackets" in control and "double quotation marks followed by that id" in control


# -- keel eval -----------------------------------------------------------------------------------


def test_keel_eval_measures_the_citations_of_its_built_in_suite() -> None:
    """`keel eval --suite citations`: a scripted model quotes a page wrongly (under `require`:
    one more turn, then partial), cites an id no result has, and quotes a result after it was
    elided; the report counts answers whose quotes all check and answers with an uncited
    factual sentence."""
    import typer
    from typer.testing import CliRunner

    from keel.evals import builtin_names
    from keel.evals.command import eval_command

    app = typer.Typer(add_completion=False)
    app.callback()(lambda: None)
    app.command("eval")(eval_command)
    assert builtin_names("citations") == ["elided_quote", "unknown_id", "wrong_quote"]
    done = CliRunner().invoke(app, ["eval", "--suite", "citations", "--json"])
    assert done.exit_code == 0, done.stdout
    report = json.loads(done.stdout)
    assert report["passed"] and report["evidence"] == {
        "answers_checked": 3,
        "quotes_all_check": 1,
        "uncited_sentence": 0,
    }
    rows = {s["name"]: s["results"][0] for s in report["scenarios"]}
    assert rows["elided_quote"]["quotes_all_check"] is True
    assert rows["elided_quote"]["results_elided"] >= 1
    assert rows["wrong_quote"]["evidence"]["quotes_failed"][0]["quote"] == "is renewed every minute"
    assert rows["unknown_id"]["evidence"]["unknown_ids"] == ["r4"]


def test_the_citation_shares_count_only_checked_answers() -> None:
    from keel.evals.judging import RunRow
    from keel.evals.report import citation_line, citation_shares

    def row(evidence: dict[str, Any] | None) -> RunRow:
        return RunRow("q", 1, "answer", "answer", True, [], evidence=evidence)

    rows = [
        row({"passed": True, "uncited_sentences": 0}),
        row({"passed": False, "uncited_sentences": 2}),
        row({"passed": True, "uncited_sentences": 1}),
        row(None),
    ]
    assert citation_shares(rows) == {
        "answers_checked": 3,
        "quotes_all_check": 2,
        "uncited_sentence": 2,
    }
    assert citation_line(rows) == (
        "evidence: every quote and id checked in 2 of 3 answers (67%); an uncited factual "
        "sentence in 2 of 3 (67%)"
    )
    assert citation_line([row(None)]) is None


# -- the former name (ADR 0058) ------------------------------------------------------------------


@pytest.fixture
def fresh_notes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No user keel.toml, no KEEL_ variable, and no former spelling noted yet in this process."""
    from keel import run_options

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    for name in ("KEEL_CITATIONS", "KEEL_EVIDENCE", "KEEL_MODEL", "KEEL_STORE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(run_options, "_NOTED", set())


def test_keel_run_still_takes_evidence_and_says_once_that_it_is_now_citations(
    tmp_path: Path, fresh_notes: None
) -> None:
    from typer.testing import CliRunner

    from keel.cli.app import app

    (tmp_path / "a.md").write_text(LEASE)
    turns = [call("read_file", path="a.md"), {"text": '"never" [r1]'}, {"text": '"ttl/3" [r1]'}]
    model = tmp_path / "script.json"
    model.write_text(json.dumps({"turns": turns}))
    store = str(tmp_path / "runs.sqlite")
    ran = CliRunner().invoke(
        app,
        ["run", "Q", "--model", f"script:{model}", "--store", store, "--repo", str(tmp_path),
         "--evidence", "require", "--json"],
    )  # fmt: skip
    assert ran.exit_code == 0, ran.output
    result = json.loads(ran.stdout)
    assert result["model_calls"] == 3 and result["evidence"]["passed"] is True  # require's turn
    note = "keel: --evidence is deprecated, it is now --citations (ADR 0058)"
    assert ran.stderr.count(note) == 1
    (record,) = keel.Store(store).list_runs()
    assert record.config.limits.citations == "require"
    saved = record.config.settings["options"]
    assert isinstance(saved, dict)
    assert saved["citations"] == {"from": "--evidence", "value": "require"}
    shown = CliRunner().invoke(app, ["run", "--help"]).stdout
    assert "--citations" in shown and not re.search(r"--evidence(?![-\w])", shown)  # hidden


def test_keel_evidence_and_the_keel_toml_key_evidence_still_set_citations(
    tmp_path: Path, fresh_notes: None, capsys: pytest.CaptureFixture[str]
) -> None:
    from keel.assemble import agent_from_options
    from keel.config import trust
    from keel.run_options import resolve, unknown_keys

    chosen = resolve({}, cwd=tmp_path, env={"KEEL_EVIDENCE": "off"})
    assert (chosen.values["citations"], chosen.sources["citations"]) == ("off", "KEEL_EVIDENCE")
    both = {"KEEL_EVIDENCE": "off", "KEEL_CITATIONS": "require"}
    assert resolve({}, cwd=tmp_path, env=both).values["citations"] == "require"  # the new wins
    (tmp_path / "keel.toml").write_text('evidence = "require"\n')
    trust(tmp_path)
    assert resolve({}, cwd=tmp_path, env={}).limits().citations == "require"
    assert unknown_keys(tmp_path) == []  # a former key is read, not reported unknown
    flagged = resolve({"evidence": "off"}, cwd=tmp_path, env={})
    assert flagged.values["citations"] == "off"  # a flag, even the former one, over keel.toml
    model = tmp_path / "script.json"
    model.write_text(json.dumps({"turns": [{"text": "done"}]}))
    agent = agent_from_options(model=f"script:{model}", evidence="off", repo=tmp_path)
    assert agent.limits.citations == "off"
    notes = capsys.readouterr().err.splitlines()
    assert notes == [
        "keel: KEEL_EVIDENCE is deprecated, it is now KEEL_CITATIONS (ADR 0058)",
        f"keel: {tmp_path / 'keel.toml'}: evidence is deprecated, it is now citations in "
        "keel.toml (ADR 0058)",
        "keel: --evidence is deprecated, it is now --citations (ADR 0058)",
    ]


async def test_a_run_stored_with_evidence_in_its_limits_loads_and_resumes_under_it(
    tmp_path: Path,
) -> None:
    """A run saved before the rename holds `"evidence": "require"` in its limits: it loads as
    `citations` and resumes under it (one more turn), not under the default `report`."""
    import sqlite3

    turns = [
        call("fetch", url="https://example.org/a"),
        {"text": '"never" [r1]'},
        {"text": '"checkpoints every step" [r1]'},
    ]
    path = tmp_path / "runs.sqlite"

    def agent(store: keel.Store, **limits: Any) -> keel.Agent:
        transport = ScriptedTransport.from_dict({"turns": turns}, record=True)
        return keel.Agent(transport, tools=[fetch], store=store, limits=keel.Limits(**limits))

    store = keel.Store(path)
    paused = await agent(store, citations="require").arun("Q")
    assert paused.status == "awaiting_approval"
    store.close()
    with sqlite3.connect(path) as db:  # as a Keel before ADR 0058 wrote it
        where = (paused.run_id,)
        (text,) = db.execute("SELECT config FROM runs WHERE run_id = ?", where).fetchone()
        config = json.loads(text)
        config["limits"]["evidence"] = config["limits"].pop("citations")
        db.execute("UPDATE runs SET config = ? WHERE run_id = ?", (json.dumps(config), *where))
    db.close()
    store = keel.Store(path)
    (record,) = store.list_runs()
    assert record.config.limits.citations == "require"
    store.decide(paused.run_id, paused.pending_approvals[0].call_id, approved=True, by="ana")
    resumed = await agent(store).aresume(paused.run_id)
    assert resumed.status == "completed" and resumed.model_calls == 3, resumed.failure
    assert resumed.evidence is not None and resumed.evidence["passed"] is True
    assert [type(e) for e in store.events(paused.run_id)].count(EvidenceRejected) == 1


def test_a_scenario_a_sub_agents_table_and_keel_eval_may_still_say_evidence(
    fresh_notes: None, capsys: pytest.CaptureFixture[str]
) -> None:
    from keel.evals import builtin_names
    from keel.evals.scenario import LimitsSpec
    from keel.run_options import _agent_table

    assert LimitsSpec.model_validate({"evidence": "require"}).citations == "require"
    table = {"description": "Reads.", "evidence": "off", "max_model_calls": 3}
    assert _agent_table("reader", table, "[agents.reader]")["limits"] == {
        "citations": "off",
        "max_model_calls": 3,
    }
    assert builtin_names("evidence") == builtin_names("citations")
    assert capsys.readouterr().err.splitlines() == [
        "keel: [limits] evidence is deprecated, it is now [limits] citations (ADR 0058)",
        "keel: [agents.reader] evidence is deprecated, it is now citations (ADR 0058)",
        "keel: --suite evidence is deprecated, it is now --suite citations (ADR 0058)",
    ]


# -- hostile answers (issue 46) ----------------------------------------------------------------


def _time(fn: Any) -> float:
    started = time.monotonic()
    fn()
    return time.monotonic() - started


def test_ev01_every_check_over_the_answer_is_linear_in_it() -> None:
    """EV-01: unclosed quotation marks, a flood of distinct ids, quotes and paths: each check
    ends (well within a generous bound; the backtracking regex took minutes on the first)."""
    big = source("r1", "filler text " * 20_000)
    answers = [
        "\u201c" * 200_000,
        'x "' * 100_000,
        "".join(f"[r{n}] " for n in range(2, 150_000)),
        "".join(f'"q{n}" [r1] ' for n in range(100_000)),
        "".join(f"see dir{n}/file{n}.py " for n in range(60_000)),
        "[" + "r1," * 100_000,
    ]
    for answer in answers:
        took = _time(lambda a=answer: check_answer(a, [big, source("r2", LEASE)]))
        assert took < 20, (answer[:20], took)


def test_ev01_an_answer_of_unclosed_quotes_ends_the_run_within_its_deadline(
    tmp_path: Path,
) -> None:
    """EV-01: 200,000 unclosed \u201c after a tool call, `--deadline 5`: the run ends (it hung
    past the deadline and SIGTERM), with its answer checked."""
    (tmp_path / "notes.md").write_text("notes\n")
    script = tmp_path / "script.json"
    turns = [call("read_file", path="notes.md"), {"text": "\u201c" * 200_000}]
    script.write_text(json.dumps({"turns": turns}))
    db = tmp_path / "r.db"
    command = [sys.executable, "-m", "keel", "run", "q", "--model", f"script:{script}",
               "--store", str(db), "--repo", str(tmp_path), "--deadline", "5",
               "--json"]  # fmt: skip
    try:
        done = subprocess.run(command, capture_output=True, timeout=60, cwd=tmp_path)
    except subprocess.TimeoutExpired:
        pytest.fail("keel run did not end within 60 s of a 5 s deadline")
    out = json.loads(done.stdout)
    assert out["status"] in ("completed", "failed"), out
    (run,) = keel.Store(str(db)).list_runs()
    assert run.status != "running"


_OLD_QUOTE = re.compile(
    r"(?:\"([^\"]+)\"|\u201c([^\u201d]+)\u201d)\s*\[\s*(r\d+(?:\s*[,;]\s*r\d+)*)\s*\]"
)


@settings(max_examples=500, deadline=None)
@given(st.text(st.sampled_from(['"', "\u201c", "\u201d", " ", "[", "]", "r", "1", ",", "a"])))
def test_ev01_the_linear_quote_scan_finds_what_the_regex_found(text: str) -> None:
    from keel.citations import _quotes

    expected = [(m.group(1) or m.group(2), m.group(3)) for m in _OLD_QUOTE.finditer(text)]
    assert list(_quotes(text)) == expected


def test_ev01_quotes_past_the_scan_budget_fail_as_not_checked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import keel.citations

    stored = len(normalise(LEASE))  # two lookups' worth: "renewed" and "q0"
    monkeypatch.setattr(keel.citations, "SCAN_BUDGET", 2 * stored + len("renewed") + len("q0"))
    answer = " ".join(f'"renewed" [r1] "q{n}" [r1]' for n in range(5))
    checked = check_answer(answer, [source("r1", LEASE)])
    reasons = [f.reason for f in checked.quotes_failed]
    assert checked.quotes_checked == 5  # the same quote is looked up once
    assert reasons == ["not_in_result"] + ["not_checked"] * 4
    assert "was not checked" in checked.failures()[-1] and not checked.passed
