"""A deadline ends in an answer: time for one synthesis turn is kept before it (ADR 0033).

The reserve is estimated from the run's own model calls (twice the longest, at least 1 s);
when the time left falls below it, the next turn is synthesis-only with reason `deadline`. The
hard DeadlineExceeded remains for a deadline too short for even that turn.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from typer.testing import CliRunner

import keel
from keel._run.budgets import deadline_reserve
from keel._run.synthesis import BUDGET_CONTROL, DEADLINE_CONTROL
from keel.cli.app import app
from keel.records import ModelRequestSent, RunCompleted, RunState
from keel.tools.base import Effect, make_tool
from keel.transports.scripted import ScriptedTransport
from support import call, run_script

ANSWER = {"text": "What the notes show so far; research stopped because time ran out."}


@keel.tool
def note(topic: str) -> str:
    """Read the note on a topic."""
    return f"note about {topic}"


def notes(n: int) -> list[dict[str, Any]]:
    return [call("note", topic=f"t{i}") for i in range(n)]


def test_a_run_with_deadline_6_against_a_1_5s_model_ends_completed_with_a_deadline_answer(
    tmp_path: Path,
) -> None:
    """`keel run --deadline 6`, each model call 1.5 s: after two research turns (3 s) the time
    left is below twice the longest call, so the third turn is the synthesis turn."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "notes.md").write_text("The breaker counts identical calls.\n")
    read = {"tool_calls": [{"name": "read_file", "arguments": {"path": "notes.md"}}]}
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": [read] * 3, "on_synthesis": ANSWER, "latency_ms": 1500}))
    db = tmp_path / "runs.db"
    started = time.monotonic()
    out = CliRunner().invoke(
        app,
        ["run", "q", "--model", f"script:{script}", "--repo", str(repo), "--store", str(db),
         "--deadline", "6", "--json"],
    )
    took = time.monotonic() - started
    assert out.exit_code == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["status"] == "completed"
    assert result["synthesized"] == "deadline"
    assert result["answer"] == ANSWER["text"]
    assert result["model_calls"] == 3 and result["tool_calls"] == 2
    assert 4.0 < took < 6.0
    shown = CliRunner().invoke(app, ["show", result["run_id"], "--store", str(db)])
    assert "synthesized: deadline" in shown.stdout
    events = keel.Store(db).events(result["run_id"])
    sent = [e.synthesis for e in events if isinstance(e, ModelRequestSent)]
    assert sent == [None, None, "deadline"]
    (done,) = [e for e in events if isinstance(e, RunCompleted)]
    assert done.synthesized == "deadline"


async def test_the_deadline_synthesis_turn_carries_its_own_control_and_no_tools() -> None:
    script = {"turns": notes(5), "on_synthesis": ANSWER, "latency_ms": 300}
    out = await run_script(script, [note], deadline=2.0)
    assert out.result.status == "completed" and out.result.synthesized == "deadline"
    last = out.requests[-1]
    assert last.tool_choice == "none"
    assert last.volatile[1:] == (DEADLINE_CONTROL,)
    assert all(r.tool_choice is None for r in out.requests[:-1])


async def test_a_deadline_too_short_for_any_turn_still_fails_deadline_exceeded() -> None:
    """The synthesis turn is sent, but it cannot finish before the deadline either."""
    script = {"turns": [*notes(1), ANSWER], "latency_ms": 600}
    out = await run_script(script, [note], deadline=1.0)
    assert out.result.failure is not None
    assert out.result.failure.kind == "DeadlineExceeded"
    assert out.result.answer is None
    assert [r.tool_choice for r in out.requests] == [None, "none"]


async def test_a_tool_request_in_the_deadline_synthesis_turn_fails_deadline_exceeded() -> None:
    script = {"turns": notes(3), "latency_ms": 300}
    out = await run_script(script, [note], deadline=1.5)
    assert out.result.failure is not None
    assert out.result.failure.kind == "DeadlineExceeded"
    assert out.result.failure.details["reason"] == "deadline"
    assert "nothing was run" in out.result.failure.message


async def test_deadline_over_budget_synthesis_sends_both_controls() -> None:
    script = {"turns": notes(2), "on_synthesis": ANSWER, "latency_ms": 700}
    out = await run_script(script, [note], deadline=2.5, max_model_calls=3)
    assert out.result.synthesized == "deadline"
    assert out.requests[-1].volatile[1:] == (DEADLINE_CONTROL, BUDGET_CONTROL)


def test_the_deadline_reserve_is_twice_the_longest_call_with_a_floor() -> None:
    limits = keel.Limits(deadline=60)
    assert deadline_reserve(RunState(), limits) is None  # nothing timed yet: no reserve
    assert deadline_reserve(RunState(longest_model_call=0.1), limits) == 1.0
    assert deadline_reserve(RunState(longest_model_call=4.0), limits) == 8.0
    fixed = keel.Limits(deadline=60, deadline_reserve=5)
    assert deadline_reserve(RunState(longest_model_call=4.0), fixed) == 5


async def test_resume_keeps_the_absolute_deadline_and_the_timings(tmp_path: Path) -> None:
    """A run paused for approval and resumed near its deadline takes the synthesis turn: the
    deadline and the longest call were saved with the run."""

    def publish(text: str) -> str:
        """Publish text."""
        return "published"

    tool = make_tool(publish, effect=Effect.SIDE_EFFECTING, requires_approval=True)
    script = {"turns": [call("publish", text="x"), *notes(2)], "on_synthesis": ANSWER,
              "latency_ms": 600}
    store = keel.Store(tmp_path / "runs.db")

    def agent() -> keel.Agent:
        transport = ScriptedTransport.from_dict(script)
        return keel.Agent(transport, tools=[tool, note], store=store,
                          limits=keel.Limits(deadline=3.0))

    started = time.monotonic()
    paused = await agent().arun("q")
    assert paused.status == "awaiting_approval"
    await asyncio.sleep(max(0.0, 2.0 - (time.monotonic() - started)))  # 1 s left < 1.2 s
    first = agent()
    first.approve(paused.run_id, "k1_0", by="tester")
    done = await first.aresume(paused.run_id)
    assert done.status == "completed" and done.synthesized == "deadline"
    assert done.model_calls == 2


async def test_traces_name_the_deadline_synthesis(spans: InMemorySpanExporter) -> None:
    script = {"turns": notes(5), "on_synthesis": ANSWER, "latency_ms": 300}
    out = await run_script(script, [note], deadline=2.0)
    assert out.result.synthesized == "deadline"
    found = {(s.attributes or {}).get("keel.synthesis") for s in spans.get_finished_spans()}
    assert "deadline" in found
