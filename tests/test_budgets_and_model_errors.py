"""Budgets, deadlines, cancellation, model errors, empty turns (ADR 0005)."""

from __future__ import annotations

import asyncio
import time

import pytest

import keel
from keel._run.gateway import RetryPolicy
from keel._run.synthesis import BUDGET_CONTROL, REPEATED_TOOL_CONTROL
from keel.records import ModelErrorSeen, ToolCallRequested, ToolResultRecorded
from keel.transports.scripted import ScriptedTransport
from support import call, run_script

ANSWER = {"text": "Partial answer from the evidence so far; research stopped at the budget."}


@keel.tool
def note(topic: str) -> str:
    """Read the note on a topic."""
    return f"note about {topic}"


@keel.tool
async def slow_note(topic: str) -> str:
    """Read a note slowly."""
    await asyncio.sleep(5)
    return topic


def distinct_calls(n: int) -> list[dict[str, object]]:
    return [call("note", topic=f"t{i}") for i in range(n)]


async def test_last_model_call_of_the_budget_is_budget_synthesis() -> None:
    out = await run_script({"turns": [*distinct_calls(3), ANSWER]}, [note], max_model_calls=4)
    assert out.result.status == "completed"
    assert out.result.synthesized == "budget"
    assert [r.tool_choice for r in out.requests] == [None, None, None, "none"]
    assert out.requests[-1].volatile[1:] == (BUDGET_CONTROL,)


async def test_tool_request_in_budget_synthesis_fails_budget_exhausted_before_dispatch() -> None:
    out = await run_script({"turns": distinct_calls(4)}, [note], max_model_calls=4)
    assert out.result.failure is not None
    assert out.result.failure.kind == "BudgetExhausted"
    assert out.result.answer is None
    assert len(out.of_type(ToolCallRequested)) == 3


async def test_exhausted_model_call_budget_fails_without_answer() -> None:
    """Retries spend the budget too; with no call left the run fails BudgetExhausted."""
    errors = [{"error": {"status": 503, "message": "overloaded"}}] * 3
    out = await run_script({"turns": errors}, [note], max_model_calls=3)
    assert out.result.status == "failed"
    assert out.result.failure is not None
    assert out.result.failure.kind == "BudgetExhausted"
    assert out.result.failure.details["budget"] == "model_calls"
    assert out.result.model_calls == 3
    assert out.result.answer is None


async def test_coinciding_budget_and_repeated_tool_synthesis_send_one_turn() -> None:
    turns = [call("note", topic="same")] * 2 + [ANSWER]
    out = await run_script({"turns": turns}, [note], loop_threshold=3, max_model_calls=3)
    assert out.result.synthesized == "budget"
    assert out.requests[-1].tool_choice == "none"
    assert out.requests[-1].volatile[1:] == (BUDGET_CONTROL, REPEATED_TOOL_CONTROL)
    assert out.result.model_calls == 3


async def test_coinciding_synthesis_tool_request_fails_as_budget_exhausted() -> None:
    turns = [call("note", topic="same")] * 2 + [call("note", topic="other")]
    out = await run_script({"turns": turns}, [note], loop_threshold=3, max_model_calls=3)
    assert out.result.failure is not None
    assert out.result.failure.kind == "BudgetExhausted"
    assert len(out.of_type(ToolCallRequested)) == 2


async def test_spent_tool_call_budget_leads_to_budget_synthesis() -> None:
    out = await run_script({"turns": [*distinct_calls(2), ANSWER]}, [note], max_tool_calls=2)
    assert out.result.synthesized == "budget"
    assert out.result.tool_calls == 2


async def test_calls_past_the_tool_budget_are_answered_not_run() -> None:
    turn = {"tool_calls": [{"name": "note", "arguments": {"topic": f"b{i}"}} for i in range(3)]}
    out = await run_script({"turns": [turn, ANSWER]}, [note], max_tool_calls=2)
    results = out.of_type(ToolResultRecorded)
    assert [r.is_error for r in results] == [False, False, True]
    assert "budget" in results[2].content
    assert out.result.tool_calls == 2


async def test_token_budget_spent_fails_budget_exhausted() -> None:
    # One long turn (a 4000-character preamble beside its call) spends the whole budget, so
    # the next step stops on the hard token check, before any synthesis turn.
    long_turn = {**call("note", topic="a"), "text": "x" * 4000}
    out = await run_script({"turns": [long_turn, *distinct_calls(5)]}, [note], max_tokens=1000)
    failure = out.result.failure
    assert failure is not None and failure.kind == "BudgetExhausted"
    assert failure.message.startswith("the token budget of 1000 was spent")
    assert failure.details == {"budget": "tokens", "limit": 1000}
    assert out.result.model_calls == 1


async def test_token_budget_running_low_gives_budget_synthesis() -> None:
    out = await run_script(
        {"turns": [*distinct_calls(50)], "on_synthesis": ANSWER}, [note], max_tokens=2_000
    )
    assert out.result.synthesized == "budget"
    assert out.result.usage.total <= 2_000


async def test_non_retryable_model_error_fails_at_once_with_provider_message() -> None:
    turns = [{"error": {"status": 400, "message": "messages.0: unsupported field"}}]
    out = await run_script({"turns": turns}, [note])
    assert out.result.failure is not None
    assert out.result.failure.kind == "ModelError"
    assert "unsupported field" in out.result.failure.message
    assert out.result.model_calls == 1


async def test_retryable_model_errors_are_retried_then_model_error() -> None:
    turns = [{"error": {"status": 429, "message": "rate limited"}}] * 3
    out = await run_script({"turns": turns}, [note], model_retries=2)
    assert out.result.failure is not None
    assert out.result.failure.kind == "ModelError"
    assert "rate limited" in out.result.failure.message
    assert out.result.model_calls == 3
    assert [e.retryable for e in out.of_type(ModelErrorSeen)] == [True, True, True]


async def test_retry_recovers_and_the_run_completes() -> None:
    turns = [{"error": {"status": 500, "message": "oops"}}, {"text": "fine"}]
    out = await run_script({"turns": turns}, [note])
    assert out.result.answer == "fine"
    assert out.result.model_calls == 2


def test_backoff_is_exponential_with_jitter_and_honours_retry_after() -> None:
    policy = RetryPolicy(retries=5, base_delay=1.0, max_delay=8.0)
    for retry, ceiling in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (5, 8.0)]:
        delays = {policy.delay(retry) for _ in range(20)}
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert len(delays) > 1
    assert policy.delay(1, retry_after=5.0) >= 5.0
    assert policy.delay(1, retry_after=100.0) == 8.0


async def test_retry_after_is_waited() -> None:
    turns = [{"error": {"status": 429, "message": "wait", "retry_after": 0.2}}, {"text": "ok"}]
    start = time.perf_counter()
    out = await run_script({"turns": turns}, [note], retry_max_delay=1.0)
    assert time.perf_counter() - start >= 0.2
    assert out.of_type(ModelErrorSeen)[0].retry_in >= 0.2


async def test_empty_turn_is_retried_once() -> None:
    out = await run_script({"turns": [{"empty": True}, {"text": "answer"}]}, [note])
    assert out.result.answer == "answer"
    assert out.result.model_calls == 2


async def test_second_empty_turn_fails_empty_model_turn() -> None:
    out = await run_script({"turns": [{"empty": True}, {"empty": True}]}, [note])
    assert out.result.failure is not None
    assert out.result.failure.kind == "EmptyModelTurn"


async def test_script_that_runs_out_is_a_model_error() -> None:
    out = await run_script({"turns": [call("note", topic="a")]}, [note])
    assert out.result.failure is not None
    assert out.result.failure.kind == "ModelError"
    assert "no turn left" in out.result.failure.message


async def test_deadline_cuts_a_slow_tool_and_fails_deadline_exceeded() -> None:
    start = time.perf_counter()
    out = await run_script(
        {"turns": [call("slow_note", topic="a"), ANSWER]}, [slow_note], deadline=0.3
    )
    assert time.perf_counter() - start < 2
    assert out.result.failure is not None
    assert out.result.failure.kind == "DeadlineExceeded"
    assert out.of_type(ToolResultRecorded)[0].is_error


async def test_deadline_cuts_a_slow_model() -> None:
    script = {"turns": [ANSWER], "latency_ms": 5000}
    start = time.perf_counter()
    out = await run_script(script, [note], deadline=0.3)
    assert time.perf_counter() - start < 2
    assert out.result.failure is not None
    assert out.result.failure.kind == "DeadlineExceeded"


async def test_cancellation_is_cooperative_and_keeps_what_was_recorded() -> None:
    store = keel.Store(":memory:")
    transport = ScriptedTransport.from_dict(
        {"turns": [call("note", topic="a"), call("slow_note", topic="b"), ANSWER]}
    )
    agent = keel.Agent(transport, tools=[note, slow_note], store=store)
    handle = agent.start("q")
    await asyncio.sleep(0.3)
    handle.cancel()
    result = await handle
    assert result.status == "cancelled"
    types = [e.type for e in store.events(result.run_id)]
    assert types.count("tool_result") == 1
    assert "run_cancelled" in types
    assert store.get_run(result.run_id).status == "cancelled"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "bad",
    [{"loop_threshold": 1}, {"max_model_calls": 0}, {"deadline": -1.0}, {"evidence_reset_cap": -1}],
)
def test_bad_limits_are_configuration_errors(bad: dict[str, object]) -> None:
    with pytest.raises(keel.ConfigError):
        keel.Limits(**bad)  # type: ignore[arg-type]
