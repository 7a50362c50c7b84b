"""Rules of docs/design.md that held in the ordinary path but drifted under resume, repeats and bad
input (tracker issue 9, "Rules that drift from the spec"). Each test failed on the code before
its fix."""

from __future__ import annotations

import asyncio
import io
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from rich.console import Console

import keel
from contract import case_openai_chat
from contract.case_openai_chat import _usage
from keel.present.progress import ProgressPrinter
from keel.present.screen import Screen
from keel.present.timeline import run_json, timeline
from keel.records import ModelRequestSent, ToolResultRecorded
from keel.transports.scripted import ScriptedTransport
from support import batch, call, run_script

ANSWER = {"text": "Done."}


@keel.tool
def note(topic: str) -> str:
    """Look a topic up in the notes."""
    return f"notes on {topic}"


@keel.tool(effect="side_effecting", requires_approval=True)
def publish(text: str) -> str:
    """Publish a note."""
    return f"posted {text}"


def agent(script: dict[str, Any], store: keel.Store, **limits: Any) -> keel.Agent:
    transport = ScriptedTransport.from_dict(script, record=True)
    return keel.Agent(
        transport, tools=[note, publish], store=store, limits=keel.Limits(**limits)
    )


async def test_resume_keeps_the_checkpointed_limits(tmp_path: Path) -> None:
    """A run paused with T=3 and a counter at 2 gets its synthesis turn when resumed by an agent
    built with default limits: the limits saved with the run win."""
    store = keel.Store(tmp_path / "runs.sqlite")
    script = {
        "turns": [
            call("note", topic="a"),
            batch(("note", {"topic": "a"}), ("publish", {"text": "x"})),
            ANSWER,
        ]
    }
    paused = await agent(script, store, loop_threshold=3).arun("q")
    assert paused.status == "awaiting_approval"
    store.decide(paused.run_id, paused.pending_approvals[0].call_id, approved=True, by="ana")

    resumed = await agent(script, store).aresume(paused.run_id)  # default limits: T=5
    assert (resumed.status, resumed.synthesized) == ("completed", "repeated_tool")
    requests = [e for e in store.events(paused.run_id) if isinstance(e, ModelRequestSent)]
    assert requests[-1].tool_choice == "none"


async def test_identical_call_in_the_batch_of_a_denied_call_is_denied_without_asking(
    tmp_path: Path,
) -> None:
    store = keel.Store(tmp_path / "runs.sqlite")
    script = {"turns": [batch(("publish", {"text": "x"}), ("publish", {"text": "x"})), ANSWER]}
    paused = await agent(script, store).arun("q")
    first, second = paused.pending_approvals
    store.decide(paused.run_id, first.call_id, approved=False, by="ana", reason="not now")

    resumed = await agent(script, store).aresume(paused.run_id)
    assert resumed.status == "completed"
    results = [e for e in store.events(paused.run_id) if isinstance(e, ToolResultRecorded)]
    assert [r.call_id for r in results] == [first.call_id, second.call_id]
    assert results[1].content.startswith("Denied again without asking: ana")


async def test_the_deadline_is_wall_clock_from_the_run_start_across_resumes(
    tmp_path: Path,
) -> None:
    store = keel.Store(tmp_path / "runs.sqlite")
    script = {"turns": [call("publish", text="x"), ANSWER]}
    paused = await agent(script, store, deadline=0.5).arun("q")
    assert paused.status == "awaiting_approval"
    store.decide(paused.run_id, paused.pending_approvals[0].call_id, approved=True, by="ana")
    await asyncio.sleep(0.6)

    resumed = await agent(script, store, deadline=0.5).aresume(paused.run_id)
    assert resumed.failure is not None and resumed.failure.kind == "DeadlineExceeded"


async def test_empty_turn_message_does_not_claim_twice_in_a_row_across_an_error() -> None:
    error = {"error": {"status": 500, "message": "boom"}}
    out = await run_script({"turns": [{"text": ""}, error, {"text": ""}]}, [note])
    failure = out.result.failure
    assert failure is not None and failure.kind == "EmptyModelTurn"
    assert "in a row" not in failure.message


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_deadline_must_be_a_finite_number_of_seconds(bad: float) -> None:
    with pytest.raises(keel.ConfigError, match="deadline"):
        keel.Limits(deadline=bad)


def test_a_question_that_is_not_text_is_a_configuration_error(tmp_path: Path) -> None:
    store = keel.Store(tmp_path / "runs.sqlite")
    with pytest.raises(keel.ConfigError, match="question"):
        agent({"turns": [ANSWER]}, store).run("bad \udcff bytes")
    assert store.list_runs() == []


def test_started_runs_record_an_absolute_deadline(tmp_path: Path) -> None:
    store = keel.Store(tmp_path / "runs.sqlite")
    before = time.time()
    result = agent({"turns": [ANSWER]}, store, deadline=30).run("q")
    record = store.get_run(result.run_id)
    assert record is not None and record.state.deadline_at is not None
    assert before + 30 <= record.state.deadline_at <= time.time() + 30


async def test_an_approval_predicate_that_raises_is_an_error_result_not_a_crash() -> None:
    def over_limit(arguments: dict[str, Any]) -> bool:
        raise RuntimeError("limits table unavailable")

    @keel.tool(effect="side_effecting", requires_approval=over_limit)
    def pay(to: str, amount: int) -> str:
        """Pay someone."""
        return "paid"

    turns = [call("pay", to="ana", amount=5), call("pay", amount="lots"), ANSWER]
    out = await run_script({"turns": turns}, [pay])
    assert out.result.status == "completed"
    first, second = out.of_type(ToolResultRecorded)
    assert first.is_error and "limits table unavailable" in first.content
    assert second.is_error and "amount" in second.content  # invalid: answered, never asked


async def test_an_answer_cut_at_the_output_limit_says_so(tmp_path: Path) -> None:
    """A completed run whose answer stopped at the model's output limit is marked `cut_off` in
    the result, its JSON, `keel show` and the progress line; the partial answer is kept."""
    cut = case_openai_chat._completion(
        {"content": "The loop depends on the breaker, the context"}, "length", _usage(90, 0, 16)
    )
    http = httpx.AsyncClient(transport=httpx.MockTransport(lambda request: cut))
    lines: list[str] = []
    printer = ProgressPrinter(Screen(Console(file=io.StringIO())))
    listener = lambda event: lines.append(printer._line(event) or "")  # noqa: E731
    store = keel.Store(tmp_path / "runs.sqlite")
    agent = keel.Agent(case_openai_chat.CASE.make(http), store=store, listeners=[listener])
    result = await agent.arun("Which modules?")

    assert (result.status, result.cut_off) == ("completed", True)
    assert result.answer == "The loop depends on the breaker, the context"
    assert result.to_dict()["cut_off"] is True
    assert "cut off at the model's output limit" in lines[-1]
    shown = io.StringIO()
    Console(file=shown, width=200).print(timeline(store.events(result.run_id)))
    assert "cut off at the output limit" in shown.getvalue()
    record = store.get_run(result.run_id)
    assert record is not None and run_json(record)["cut_off"] is True


@pytest.mark.parametrize("url", ["not a url", "ftp://example.org/v1", "http://256.1.1.1/", "http:///v1"])
def test_a_bad_base_url_is_a_configuration_error_at_once(url: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "keel", "run", "q", "--model", "openai-chat:m", "--base-url", url,
         "--store", str(tmp_path / "runs.sqlite"), "--json"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "OPENAI_API_KEY": ""},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("keel: base URL") and "Traceback" not in done.stderr
    assert json.loads(done.stdout)["error"]["kind"] == "ConfigError"  # --json: on stdout too


def test_a_question_with_bytes_that_are_not_utf8_is_refused_by_the_command_line(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        [sys.executable.encode(), b"-m", b"keel", b"run", b"caf\xe9?", b"--model",
         b"script:examples/repeated_research.json", b"--store", str(tmp_path / "s").encode()],
        capture_output=True, timeout=60, cwd=Path(__file__).parents[1],
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert b"the question is not valid text" in done.stderr and b"Traceback" not in done.stderr
