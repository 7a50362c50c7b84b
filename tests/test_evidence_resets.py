"""Evidence resets for progressing observations (ADR 0003), with real observe_page polls."""

from __future__ import annotations

import keel
from keel._run.breaker import IdenticalCallBreaker, tier_of
from keel.records import EvidenceReset, ToolResultRecorded
from pageserver import PageServer
from support import call, run_script

ANSWER = {"text": "The job finished."}


def web() -> list[keel.Tool]:
    return keel.web_tools(allow_hosts=["127.0.0.1"])


async def test_progressing_observation_restarts_its_counter(page_server: PageServer) -> None:
    page_server.add_dynamic("/progress", lambda n: f"<p>progress {min(n * 20, 100)}%</p>")
    url = page_server.url("/progress")
    # T=3: without resets the 2nd poll would already leave the counter at T-1.
    turns = [call("observe_page", url=url)] * 4 + [ANSWER]
    out = await run_script({"turns": turns}, web(), loop_threshold=3)

    assert out.result.status == "completed"
    assert out.result.synthesized is None
    assert page_server.hits("/progress") == 4
    assert len(out.of_type(EvidenceReset)) == 3
    assert all(r.tool_choice is None for r in out.requests)


async def test_unchanged_observation_grows_like_any_call(page_server: PageServer) -> None:
    page_server.add_page("/static", "<p>progress 40%</p>")
    url = page_server.url("/static")
    turns = [call("observe_page", url=url)] * 2
    out = await run_script({"turns": turns, "on_synthesis": ANSWER}, web(), loop_threshold=3)
    assert not out.of_type(EvidenceReset)
    assert out.result.synthesized == "repeated_tool"


async def test_evidence_reset_cap_then_the_counter_grows(page_server: PageServer) -> None:
    page_server.add_dynamic("/ticker", lambda n: f"<p>tick {n}</p>")
    url = page_server.url("/ticker")
    # T=3, R=2: polls 1,2 (count 2 = T-1 would synthesize, but poll 2 changed: reset to 1),
    # poll 3 reset (2nd and last), then polls 4 and 5 grow the counter to T-1.
    turns = [call("observe_page", url=url)] * 5
    out = await run_script(
        {"turns": turns, "on_synthesis": ANSWER}, web(), loop_threshold=3, evidence_reset_cap=2
    )
    assert len(out.of_type(EvidenceReset)) == 2
    assert out.result.synthesized == "repeated_tool"
    assert page_server.hits("/ticker") == 4
    counters = out.store.counters(out.result.run_id)
    (counter,) = (c for key, c in counters.items() if tier_of(key) is None)  # tiers: their own
    assert counter.resets == 2 and counter.count == 2


async def test_resets_are_applied_before_the_synthesis_check(page_server: PageServer) -> None:
    page_server.add_dynamic("/job", lambda n: f"<p>step {n}</p>")
    url = page_server.url("/job")
    # T=3: the 2nd poll brings the counter to T-1; its changed content resets it first.
    turns = [call("observe_page", url=url)] * 2 + [ANSWER]
    out = await run_script({"turns": turns}, web(), loop_threshold=3)
    assert [r.tool_choice for r in out.requests] == [None, None, None]
    assert out.result.synthesized is None
    reset = out.of_type(EvidenceReset)[0]
    assert reset.step == 2


async def test_read_only_calls_never_reset_under_the_adr_policy(page_server: PageServer) -> None:
    page_server.add_dynamic("/changing", lambda n: f"<p>version {n}</p>")
    url = page_server.url("/changing")
    out = await run_script(
        {"turns": [call("fetch", url=url)] * 2, "on_synthesis": ANSWER},
        web(),
        loop_threshold=3,
        loop_policy="adr",
    )
    assert not out.of_type(EvidenceReset)
    assert out.result.synthesized == "repeated_tool"


async def test_a_changed_read_only_result_restarts_its_counter_under_progress(
    page_server: PageServer,
) -> None:
    """Under the default policy a read whose result changed is evidence of change too, with the
    same cap R as observations: a page that changes on every fetch still ends in synthesis."""
    page_server.add_dynamic("/changing", lambda n: f"<p>version {n}</p>")
    url = page_server.url("/changing")
    out = await run_script(
        {"turns": [call("fetch", url=url)] * 8, "on_synthesis": ANSWER},
        web(),
        loop_threshold=3,
        evidence_reset_cap=2,
    )
    resets = out.of_type(EvidenceReset)
    assert [r.reason for r in resets] == ["result_changed", "result_changed"]
    assert out.result.synthesized == "repeated_tool"
    assert out.result.tool_calls == 4  # 1, reset, reset, then 2 = T-1


def test_breaker_reset_bookkeeping() -> None:
    breaker = IdenticalCallBreaker(threshold=5, reset_cap=1)
    breaker.record(["k"] * 4)
    assert breaker.synthesis_key() == "k"
    assert breaker.observe("k", "d1") is False  # first observation: nothing to compare
    assert breaker.observe("k", "d2") is True
    assert breaker.count("k") == 1 and breaker.synthesis_key() is None
    assert breaker.observe("k", "d3") is False  # cap reached
    assert breaker.take_dirty()["k"].resets == 1
    assert breaker.take_dirty() == {}



async def test_changing_error_results_never_reset() -> None:
    # An observation that fails differently on every poll is not evidence of progress.
    polls = iter(range(1, 100))

    @keel.tool(effect="observation")
    def poll_job(job: str) -> str:
        """Poll a job's status."""
        raise RuntimeError(f"backend unavailable (attempt {next(polls)})")

    out = await run_script(
        {"turns": [call("poll_job", job="j1")] * 2, "on_synthesis": ANSWER},
        [poll_job],
        loop_threshold=3,
    )
    results = out.of_type(ToolResultRecorded)
    assert [r.is_error for r in results] == [True, True]
    assert results[0].digest != results[1].digest
    assert not out.of_type(EvidenceReset)
    assert out.result.synthesized == "repeated_tool"
