"""Repeated-tool synthesis (ADR 0002) and the identical-call breaker (ADR 0001), with the
commissioning ADR's regression list: configured thresholds, batches, retries, refusal before
dispatch, the incident. Real web tools against pages served on loopback; the model is scripted."""

from __future__ import annotations

import pytest

import keel
from keel._run.synthesis import REPEATED_TOOL_CONTROL
from keel.records import (
    ModelRequestSent,
    ModelResponseReceived,
    ResultElided,
    ToolCallRequested,
    ToolResultRecorded,
)
from pageserver import PageServer
from support import batch, call, run_script

ANSWER = {"text": "Best supported answer. Gaps remain. Research stopped because it was repeating."}


@pytest.fixture
def web(page_server: PageServer) -> list[keel.Tool]:
    page_server.add_page("/doc", "<h1>Design</h1><p>The loop checkpoints every step.</p>")
    page_server.add_page("/other", "<p>Another page.</p>")
    return keel.web_tools(allow_hosts=["127.0.0.1"])


@pytest.mark.parametrize("threshold", [2, 3, 5])
async def test_synthesis_turn_follows_threshold_minus_one_identical_calls(
    threshold: int, web: list[keel.Tool], page_server: PageServer
) -> None:
    url = page_server.url("/doc")
    script = {"turns": [call("fetch", url=url)] * (threshold - 1), "on_synthesis": ANSWER}
    out = await run_script(script, web, loop_threshold=threshold)

    assert out.result.status == "completed"
    assert out.result.synthesized == "repeated_tool"
    assert out.result.answer == ANSWER["text"]
    assert page_server.hits("/doc") == threshold - 1
    choices = [r.tool_choice for r in out.requests]
    assert choices == [None] * (threshold - 1) + ["none"]
    out.transport.assert_consumed()


async def test_synthesis_request_keeps_definitions_history_and_adds_volatile_control_last(
    web: list[keel.Tool], page_server: PageServer
) -> None:
    url = page_server.url("/doc")
    out = await run_script({"turns": [call("fetch", url=url)] * 4, "on_synthesis": ANSWER}, web)
    normal, synthesis = out.requests[-2], out.requests[-1]
    assert synthesis.tool_choice == "none"
    assert synthesis.tools == normal.tools and len(synthesis.tools) == 2
    assert synthesis.system == normal.system
    assert synthesis.items[: len(normal.items)] == normal.items
    assert synthesis.volatile == (
        "The question to answer: What does the evidence say?",
        REPEATED_TOOL_CONTROL,
    )
    assert all(not r.volatile for r in out.requests[:-1])
    # The control quotes neither arguments nor retrieved text.
    assert url not in REPEATED_TOOL_CONTROL and "checkpoints" not in REPEATED_TOOL_CONTROL


async def test_the_synthesis_turn_restates_the_question_before_its_control(
    web: list[keel.Tool], page_server: PageServer
) -> None:
    """ADR 0043: at the end of a long context the local model answered a question about the
    tool it had called; the synthesis turn now restates the run's question (one line, in the
    request only: never recorded)."""
    url = page_server.url("/doc")
    question = "Which modules does\n the loop   import?"
    script = {"turns": [call("fetch", url=url)] * 4, "on_synthesis": ANSWER}
    out = await run_script(script, web, question=question)
    restated = "The question to answer: Which modules does the loop import?"
    assert out.requests[-1].volatile[0] == restated
    assert not any("The question to answer" in repr(e) for e in out.events)
    from keel._run.synthesis import question_control

    assert question_control("x" * 1001) is None and question_control("  ") is None


async def test_counter_is_run_wide_not_consecutive(
    web: list[keel.Tool], page_server: PageServer
) -> None:
    doc, other = page_server.url("/doc"), page_server.url("/other")
    turns = [call("fetch", url=doc), call("fetch", url=other), call("fetch", url=doc)]
    out = await run_script({"turns": turns, "on_synthesis": ANSWER}, web, loop_threshold=3)
    assert out.result.synthesized == "repeated_tool"
    assert [r.tool_choice for r in out.requests] == [None, None, None, "none"]


async def test_tool_request_in_synthesis_turn_fails_before_dispatch_even_with_other_arguments(
    web: list[keel.Tool], page_server: PageServer
) -> None:
    doc, other = page_server.url("/doc"), page_server.url("/other")
    turns = [call("fetch", url=doc)] * 2 + [call("fetch", url=other)]
    out = await run_script({"turns": turns}, web, loop_threshold=3)

    assert out.result.status == "failed"
    assert out.result.failure is not None
    assert out.result.failure.kind == "ToolLoopDetected"
    assert "synthesis" in out.result.failure.message
    assert page_server.hits("/other") == 0
    assert out.requests[-1].tool_choice == "none"
    assert len(out.of_type(ToolCallRequested)) == 2


async def test_batch_that_would_reach_threshold_fails_before_any_dispatch(
    web: list[keel.Tool], page_server: PageServer
) -> None:
    doc, other = page_server.url("/doc"), page_server.url("/other")
    turns = [
        call("fetch", url=doc),
        batch(("fetch", {"url": other}), ("fetch", {"url": doc}), ("fetch", {"url": doc})),
    ]
    out = await run_script({"turns": turns}, web, loop_threshold=3)

    assert out.result.failure is not None
    assert out.result.failure.kind == "ToolLoopDetected"
    assert out.result.failure.details["count"] == 3
    assert page_server.hits("/other") == 0
    assert page_server.hits("/doc") == 1
    assert len(out.of_type(ToolCallRequested)) == 1


async def test_answered_calls_of_every_kind_count_toward_the_breaker(
    web: list[keel.Tool],
) -> None:
    unknown = {"tool_calls": [{"name": "no_such_tool", "arguments": {"x": 1}}]}
    bad_json = {"tool_calls": [{"name": "fetch", "arguments": "{not json"}]}
    bad_args = {"tool_calls": [{"name": "fetch", "arguments": {"link": "x"}}]}
    for turn in (unknown, bad_json, bad_args):
        out = await run_script(
            {"turns": [turn, turn], "on_synthesis": ANSWER}, web, loop_threshold=3
        )
        results = out.of_type(ToolResultRecorded)
        assert len(results) == 2 and all(r.is_error for r in results)
        assert out.result.synthesized == "repeated_tool", turn


async def test_retries_during_synthesis_turn_stay_synthesis_only(
    web: list[keel.Tool], page_server: PageServer
) -> None:
    url = page_server.url("/doc")
    turns = [call("fetch", url=url)] * 2 + [
        {"error": {"status": 500, "message": "upstream hiccup"}},
        {"error": {"status": 429, "message": "slow down"}},
        ANSWER,
    ]
    out = await run_script({"turns": turns}, web, loop_threshold=3)

    assert out.result.synthesized == "repeated_tool"
    assert [r.tool_choice for r in out.requests] == [None, None, "none", "none", "none"]
    assert all(r.volatile[1:] == (REPEATED_TOOL_CONTROL,) for r in out.requests[2:])
    assert out.result.model_calls == 5
    synthesis_requests = [e for e in out.of_type(ModelRequestSent) if e.synthesis]
    assert [e.attempt for e in synthesis_requests] == [1, 2, 3]


async def test_synthesis_usage_is_recorded(web: list[keel.Tool], page_server: PageServer) -> None:
    url = page_server.url("/doc")
    out = await run_script({"turns": [call("fetch", url=url), ANSWER]}, web, loop_threshold=2)
    responses = out.of_type(ModelResponseReceived)
    assert out.result.usage.input_tokens == sum(r.usage.input_tokens for r in responses)
    assert responses[-1].usage.input_tokens > 0


async def test_incident_interleaved_large_reads_elided_and_refetched_end_synthesized(
    page_server: PageServer,
) -> None:
    """The commissioning incident: large documents read among other reads, elided from the
    context, refetched; the run must end with a synthesized answer, not ToolLoopDetected."""
    big = "<h1>Spec</h1>" + "<p>" + ("The run loop stores each step durably. " * 600) + "</p>"
    page_server.add_page("/spec", big)
    page_server.add_page("/a", "<p>" + ("Notes about tools. " * 500) + "</p>")
    page_server.add_page("/b", "<p>" + ("Notes about stores. " * 500) + "</p>")
    spec, a, b = (page_server.url(p) for p in ("/spec", "/a", "/b"))
    order = [spec, a, spec, b, spec, a, spec]  # the 4th fetch of /spec ends at T-1
    turns = [call("fetch", url=u) for u in order]
    out = await run_script(
        {"turns": turns, "on_synthesis": ANSWER},
        keel.web_tools(allow_hosts=["127.0.0.1"]),
        context_tokens=9_000,
    )

    assert out.result.status == "completed", out.result.failure
    assert out.result.synthesized == "repeated_tool"
    assert page_server.hits("/spec") == 4
    assert out.of_type(ResultElided), "the large reads must really have been elided"
    last = out.requests[-1]
    pointers = [i for i in last.items if isinstance(i, keel.ToolResult) and i.elided]
    assert pointers
    for pointer in pointers:
        assert "elided to save context" in pointer.content
        assert "stores each step durably" not in pointer.content
        assert pointer.digest[:16] in pointer.content
    sent_text = "".join(i.content for i in last.items if isinstance(i, keel.ToolResult))
    assert sent_text.count("stores each step durably") < 600 * 4
    assert last.estimated_input_tokens <= 9_000 + 2_000


async def test_refetching_an_elided_result_counts_the_same(page_server: PageServer) -> None:
    page_server.add_page("/big", "<p>" + ("x y z " * 4000) + "</p>")
    url = page_server.url("/big")
    out = await run_script(
        {"turns": [call("fetch", url=url)] * 3},
        keel.web_tools(allow_hosts=["127.0.0.1"]),
        loop_threshold=3,
        context_tokens=3_000,
    )
    assert out.of_type(ResultElided)
    assert out.result.failure is not None and out.result.failure.kind == "ToolLoopDetected"
    assert page_server.hits("/big") == 2
