"""The repeat tiers know searches (ADR 0061): the same question reworded, finding the same hits,
is one `same_result` chain, because `web_search`'s text is its hits and never the query. A
scripted run against the real page server, answering SearXNG's JSON whatever the query."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from keel.evals.pageserver import PageServer
from keel.records import ToolCallRequested
from keel.tools.search_backends import SearxngBackend
from keel.tools.web_search import search_tools
from support import call, run_script

REWORDED = [
    "how does keel stop a tool loop",
    "keel tool loop breaker",
    "what ends a repeating agent run in keel",
    "keel repeated calls limit",
    "keel loop detection",
    "keel identical call threshold",
]


@pytest.fixture
def searxng() -> Iterator[PageServer]:
    hits = [
        {"url": "https://keel.example/docs/loop-rules", "title": "Loop rules", "content": "T-1"},
        {"url": "https://keel.example/docs/design", "title": "Design", "content": "synthesis"},
    ]
    answer = {"query": "ignored", "number_of_results": 2, "results": hits}
    answer |= {k: [] for k in ("answers", "corrections", "infoboxes", "suggestions")}
    answer["unresponsive_engines"] = []
    with PageServer() as server:
        server.add_page("/search", json.dumps(answer), "application/json")
        yield server


def script() -> dict[str, object]:
    turns = [call("web_search", query=q) for q in REWORDED]
    return {"turns": [*turns, {"text": "Done."}], "on_synthesis": {"text": "Loop rules [r1]."}}


def requested(events: list[object]) -> int:
    return sum(isinstance(e, ToolCallRequested) for e in events)


async def test_reworded_searches_with_the_same_hits_bring_the_synthesis_turn(
    searxng: PageServer,
) -> None:
    tools = search_tools(SearxngBackend(searxng.base_url, allow_hosts=["127.0.0.1"]))
    out = await run_script(script(), tools, loop_threshold=5, repeat_same_result=True)
    assert out.result.status == "completed"
    assert out.result.synthesized == "repeated_tool"
    assert requested(out.events) == 4 and searxng.hits("/search") == 4  # T-1, then synthesis
    assert out.result.answer == "Loop rules [r1]."


async def test_without_the_tier_reworded_searches_are_new_calls(searxng: PageServer) -> None:
    tools = search_tools(SearxngBackend(searxng.base_url, allow_hosts=["127.0.0.1"]))
    out = await run_script(script(), tools, loop_threshold=5, repeat_same_result=False)
    assert out.result.synthesized is None and out.result.answer == "Done."
    assert requested(out.events) == 6 and searxng.hits("/search") == 6
