"""ADR 0038 (conversations): a follow-up question on an ended run is a new run of the same
conversation whose history is the earlier runs' recorded items, checked on the real SDK's
outgoing requests; its counters and budgets start fresh; it works from another process; a run
that has not ended refuses one; an old (schema 3) store opens and its runs can be continued."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

import keel
from contract import case_anthropic, case_openai_chat, case_openai_responses
from contract.harness import Recorder
from keel.transports.base import Transport
from keel.transports.scripted import ScriptedTransport

pytest_plugins = ["postgres"]

SRC = str(Path(keel.__file__).parents[1])


@keel.tool(requires_approval=True)
def fetch(url: str) -> str:
    """Download a web page as text."""
    return f"page {url}: the loop checkpoints every step"


@keel.tool
def read_file(path: str) -> str:
    """Read a file of the repository."""
    return f"{path}: from keel._run.breaker import IdenticalCallBreaker"


Case = tuple[Callable[[httpx.AsyncClient], Transport], Any, str]
CASES: dict[str, Case] = {
    "openai_responses": (case_openai_responses.CASE.make, case_openai_responses.CASE, "input"),
    "openai_chat": (case_openai_chat.CASE.make, case_openai_chat.CASE, "messages"),
    "anthropic": (case_anthropic.CASE.make, case_anthropic.CASE, "messages"),
}


def _without_breakpoints(value: Any) -> Any:
    """Anthropic's cache breakpoint sits on the newest block of each request (ADR 0021): it
    moves by design, so it is left out of the comparison; everything else must be equal."""
    if isinstance(value, dict):
        return {k: _without_breakpoints(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_without_breakpoints(v) for v in value]
    return value


@pytest.mark.parametrize("name", sorted(CASES))
async def test_a_follow_up_sends_the_first_runs_history_byte_for_byte_plus_the_new_question(
    name: str, tmp_path: Path
) -> None:
    make, case, key = CASES[name]
    store = keel.Store(tmp_path / "runs.sqlite")
    first = Recorder(case.tool_calls_response(), case.text_response())
    tools = [fetch, read_file]
    done = await keel.Agent(
        make(first.http()), tools=tools, store=store, approve_tools=["fetch"]
    ).arun("Which?")
    assert done.status == "completed"

    second = Recorder(case.text_response())  # a fresh agent and transport, as in a new process
    follow = await keel.Agent(make(second.http()), tools=tools, store=store).aask(
        done.run_id, "And the store layer?"
    )

    assert follow.status == "completed" and follow.run_id != done.run_id
    assert follow.conversation_id == done.run_id == done.conversation_id
    last, asked = first.body(), second.body()
    history = last[key]
    sent = asked[key]
    assert _without_breakpoints(sent[: len(history)]) == _without_breakpoints(history)
    answer, question = sent[len(history) :]
    assert "The loop depends on the breaker." in json.dumps(answer)
    assert "And the store layer?" in json.dumps(question)
    # Byte for byte: the history's items are serialised exactly as the first run sent them.
    for item in history:
        text = json.dumps(_without_breakpoints(item), separators=(",", ":"))
        assert (
            text.encode() in json.dumps(_without_breakpoints(sent), separators=(",", ":")).encode()
        )
    # The rest of the request (system text, tools, the provider cache key) is unchanged too.
    assert {k: v for k, v in asked.items() if k != key} == {
        k: v for k, v in last.items() if k != key
    }


def script(*turns: dict[str, Any]) -> ScriptedTransport:
    return ScriptedTransport.from_dict({"turns": list(turns)}, record=True)


def read(path: str) -> dict[str, Any]:
    return {"tool_calls": [{"name": "read_file", "arguments": {"path": path}}]}


def test_a_follow_ups_counters_and_budgets_start_fresh(tmp_path: Path) -> None:
    store = keel.Store(tmp_path / "runs.sqlite")
    limits = keel.Limits(max_model_calls=2, loop_threshold=2)
    first = keel.Agent(
        script(read("a"), {"text": "first"}), tools=[read_file], store=store, limits=limits
    ).run("Q1")
    assert first.status == "completed" and first.model_calls == 2
    # The same call again would trip a loop rule counted over the conversation; per run it
    # is the first such call, and the model-call budget of 2 is the follow-up's own.
    follow = keel.Agent(
        script(read("a"), {"text": "second"}), tools=[read_file], store=store, limits=limits
    ).ask(first.run_id, "Q2")
    assert follow.status == "completed", follow.failure
    assert (follow.model_calls, follow.tool_calls) == (2, 1)
    assert store.counters(follow.run_id)["read_file " + '{"path":"a"}'].count == 1
    record = store.get_run(follow.run_id)
    assert record is not None and record.state.step <= 2


def test_a_paused_run_refuses_a_follow_up_with_a_clear_message(tmp_path: Path) -> None:
    store = keel.Store(tmp_path / "runs.sqlite")
    fetching = {"tool_calls": [{"name": "fetch", "arguments": {"url": "https://example.org"}}]}
    paused = keel.Agent(script(fetching), tools=[fetch], store=store).run("Q1")
    assert paused.status == "awaiting_approval"
    agent = keel.Agent(script({"text": "x"}), tools=[fetch], store=store)
    with pytest.raises(keel.ConfigError, match=r"has not ended \(awaiting_approval\): resume it"):
        agent.ask(paused.run_id, "Q2")
    assert store.count_runs() == 1  # nothing was started


def test_asking_a_run_that_already_has_a_follow_up_needs_fork(tmp_path: Path) -> None:
    store = keel.Store(tmp_path / "runs.sqlite")
    first = keel.Agent(script({"text": "one"}), store=store).run("Q1")
    second = keel.Agent(script({"text": "two"}), store=store).ask(first.run_id, "Q2")
    with pytest.raises(keel.ConfigError, match=f"goes on at {second.run_id}"):
        keel.Agent(script({"text": "x"}), store=store).ask(first.run_id, "Q3")
    forking = script({"text": "forked"})
    fork = keel.Agent(forking, store=store).ask(first.run_id, "Q3", fork=True)
    assert fork.conversation_id == fork.run_id  # a conversation of its own
    texts = [getattr(i, "text", None) for i in forking.requests[0].items]
    assert texts == ["Q1", "one", "Q3"]  # the history up to the run it forks from
    # `conversation=`: a follow-up on the conversation's newest run.
    going_on = script({"text": "three"})
    keel.Agent(going_on, store=store).run("Q4", conversation=first.conversation_id)
    texts = [getattr(i, "text", None) for i in going_on.requests[0].items]
    assert texts == ["Q1", "one", "Q2", "two", "Q4"]


def test_a_follow_up_keeps_the_elisions_its_history_had(tmp_path: Path) -> None:
    """Results elided in the first run stay pointers, as they were in its last request."""
    store = keel.Store(tmp_path / "runs.sqlite")

    @keel.tool(name="read_file")
    def big(path: str) -> str:
        """Read a file of the repository."""
        return path * 4000

    limits = keel.Limits(context_tokens=1700)  # room for read_result once offered
    first_model = script(read("a"), read("b"), read("c"), {"text": "done"})
    first = keel.Agent(first_model, tools=[big], store=store, limits=limits).run("Q1")
    assert first.status == "completed"
    assert store.elided(first.run_id)  # something was elided
    follow_model = script({"text": "again"})
    keel.Agent(follow_model, tools=[big], store=store, limits=limits).ask(first.run_id, "Q2")
    last, asked = first_model.requests[-1].items, follow_model.requests[0].items
    assert [(type(i), getattr(i, "content", None)) for i in asked[: len(last)]] == [
        (type(i), getattr(i, "content", None)) for i in last
    ]


def test_a_resumed_follow_up_still_has_its_conversations_history(tmp_path: Path) -> None:
    store = keel.Store(tmp_path / "runs.sqlite")
    first = keel.Agent(script({"text": "one"}), tools=[fetch], store=store).run("Q1")
    fetching = {"tool_calls": [{"name": "fetch", "arguments": {"url": "https://example.org"}}]}
    paused = keel.Agent(script(fetching), tools=[fetch], store=store).ask(first.run_id, "Q2")
    assert paused.status == "awaiting_approval"
    store.decide(paused.run_id, paused.pending_approvals[0].call_id, approved=True, by="ana")
    resumed_model = script(fetching, {"text": "two"})
    resumed = keel.Agent(resumed_model, tools=[fetch], store=store).resume(paused.run_id)
    assert resumed.status == "completed" and resumed.conversation_id == first.run_id
    texts = [getattr(i, "text", None) for i in resumed_model.requests[0].items]
    assert texts[:3] == ["Q1", "one", "Q2"]


def keel_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "keel", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin", "HOME": str(cwd)},
        timeout=120,
    )


def test_a_follow_up_from_another_process_with_keel_ask(tmp_path: Path) -> None:
    store = tmp_path / "runs.sqlite"
    (tmp_path / "one.json").write_text('{"turns": [{"text": "first answer"}]}')
    (tmp_path / "two.json").write_text('{"turns": [{"text": "second answer"}]}')
    first = keel.Agent("script:" + str(tmp_path / "one.json"), store=store).run("Q1")
    done = keel_cli(
        "ask",
        first.run_id,
        "Q2",
        "--model",
        "script:two.json",
        "--store",
        str(store),
        "--json",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["conversation_id"] == first.run_id and result["run_id"] != first.run_id
    assert result["answer"] == "second answer"
    shown = keel_cli("show", result["run_id"], "--store", str(store), cwd=tmp_path)
    assert f"continues from: {first.run_id}" in shown.stdout
    listed = keel_cli("runs", "--store", str(store), cwd=tmp_path)
    assert f"conversation {first.run_id} (2 runs listed)" in listed.stdout


def test_keel_ask_on_a_paused_run_says_resume_it(tmp_path: Path) -> None:
    store = tmp_path / "runs.sqlite"
    fetching = {"tool_calls": [{"name": "fetch", "arguments": {"url": "https://example.org"}}]}
    paused = keel.Agent(script(fetching), tools=[fetch], store=store).run("Q1")
    (tmp_path / "two.json").write_text('{"turns": [{"text": "x"}]}')
    refused = keel_cli(
        "ask",
        paused.run_id,
        "Q2",
        "--model",
        "script:two.json",
        "--store",
        str(store),
        cwd=tmp_path,
    )
    assert refused.returncode == 2
    assert f"resume it first (keel resume {paused.run_id})" in refused.stderr


def _to_schema_3(target: str | Path) -> None:
    """The store as Keel's schema 3 left it: no conversation column, version 3."""
    if isinstance(target, Path):
        with sqlite3.connect(target) as conn:
            conn.execute("DROP INDEX runs_by_conversation")
            conn.execute("ALTER TABLE runs DROP COLUMN conversation_id")
            conn.execute("PRAGMA user_version=3")
        return
    with psycopg.connect(target, autocommit=True) as pg:
        pg.execute("ALTER TABLE keel.runs DROP COLUMN conversation_id")
        pg.execute("UPDATE keel.schema_version SET version = 3")


def test_a_schema_3_store_opens_and_its_runs_can_be_continued(store_target: str | Path) -> None:
    first = keel.Agent(script({"text": "one"}), store=store_target).run("Q1")
    _to_schema_3(store_target)
    follow_model = script({"text": "two"})
    with keel.Agent(follow_model, store=store_target) as agent:
        follow = agent.ask(first.run_id, "Q2")
        assert follow.status == "completed" and follow.conversation_id == first.run_id
        assert [r.run_id for r in agent.store.conversation(first.run_id)] == [
            first.run_id,
            follow.run_id,
        ]
    texts = [getattr(i, "text", None) for i in follow_model.requests[0].items]
    assert texts == ["Q1", "one", "Q2"]


def test_keel_ui_groups_runs_by_conversation_and_shows_what_a_follow_up_continues(
    tmp_path: Path,
) -> None:
    from starlette.testclient import TestClient

    from keel.ui.app import create_app
    from keel.ui.security import served_hosts

    store = tmp_path / "runs.sqlite"
    first = keel.Agent(script({"text": "one"}), store=store).run("Q1")
    other = keel.Agent(script({"text": "other"}), store=store).run("Q other")
    follow = keel.Agent(script({"text": "two"}), store=store).ask(first.run_id, "Q2")
    base = "http://127.0.0.1:8350"
    with TestClient(create_app(store, served_hosts("127.0.0.1", 8350)), base_url=base) as ui:
        page = ui.get("/").text
        run_page = ui.get(f"/runs/{follow.run_id}").text
    # The conversation takes its newest run's place (first in the list), oldest run first.
    order = [page.index(f'href="/runs/{r}"') for r in (first.run_id, follow.run_id, other.run_id)]
    assert order == sorted(order)
    assert page.count(f'data-conversation="{first.run_id}"') == 2
    assert f'continues from <a href="/runs/{first.run_id}">' in run_page


async def test_a_run_that_ended_on_an_unanswered_call_can_be_continued(tmp_path: Path) -> None:
    """The hard loop limit ends a run on a turn whose call never ran: the follow-up's history
    answers it ("not run"), since a provider refuses a call without its result."""
    store = keel.Store(tmp_path / "runs.sqlite")
    again = read("a")
    limits = keel.Limits(loop_threshold=2, repeat_synthesis=False)
    first = await keel.Agent(
        script(again, again), tools=[read_file], store=store, limits=limits
    ).arun("Q1")
    assert first.failure is not None and first.failure.kind == "ToolLoopDetected"
    case = case_openai_responses.CASE
    sent = Recorder(case.text_response())
    follow = await keel.Agent(case.make(sent.http()), tools=[read_file], store=store).aask(
        first.run_id, "Q2"
    )
    assert follow.status == "completed"
    items = sent.body()["input"]
    calls = [i["call_id"] for i in items if i.get("type") == "function_call"]
    outputs = {i["call_id"]: i["output"] for i in items if i.get("type") == "function_call_output"}
    assert len(calls) == 2 and set(calls) == set(outputs)
    assert f"not run: run {first.run_id} ended (failed)" in outputs[calls[-1]]
