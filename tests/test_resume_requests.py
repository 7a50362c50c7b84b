"""ADR 0009 (durable runs and resume): resume continues a run "so the next request is what it would
have been". Checked on the wire: a run paused for approval and resumed in a fresh agent sends the
same bytes as the same run left uninterrupted, with provider data in play (OpenAI Responses
reasoning items, Anthropic thinking blocks with their signatures) and over the XML fallback. """

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

import keel
from contract import case_anthropic, case_openai_responses
from contract.harness import Recorder
from keel.transports.base import Transport
from keel.transports.scripted import ScriptedTransport
from keel.transports.xml_fallback import XmlFallbackTransport

SIGNATURE = "EqQBCkgIBRABGAIiQL6mIuBrzCvBJ2oJ3LKTH0XK4Qhfb0C4s8zRJqYxEw" + "A" * 40


@keel.tool(requires_approval=True)
def fetch(url: str) -> str:
    """Download a web page as text."""
    return f"page {url}: the loop checkpoints every step"


@keel.tool
def read_file(path: str) -> str:
    """Read a file of the repository."""
    return f"{path}: from keel._run.breaker import IdenticalCallBreaker"


def anthropic_thinking_turn() -> httpx.Response:
    return case_anthropic._message(
        [
            {"type": "thinking", "thinking": "Both sources are needed.", "signature": SIGNATURE},
            {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5"},
            {
                "type": "tool_use",
                "id": "toolu_01A",
                "name": "fetch",
                "input": {"url": "https://example.org/a"},
            },
            {"type": "tool_use", "id": "toolu_01B", "name": "read_file", "input": {"path": "x"}},
        ],
        "tool_use",
        {"input_tokens": 512, "output_tokens": 88},
    )


Case = tuple[Callable[[httpx.AsyncClient], Transport], Callable[[], list[httpx.Response]]]
CASES: dict[str, Case] = {
    "openai_responses_reasoning": (
        case_openai_responses.CASE.make,
        lambda: [
            case_openai_responses.CASE.tool_calls_response(),
            case_openai_responses.CASE.text_response(),
        ],
    ),
    "anthropic_thinking": (
        case_anthropic.CASE.make,
        lambda: [anthropic_thinking_turn(), case_anthropic.CASE.text_response()],
    ),
}


def agent(transport: Transport, store: keel.Store, **options: Any) -> keel.Agent:
    return keel.Agent(transport, tools=[fetch, read_file], store=store, **options)


@pytest.mark.parametrize("name", sorted(CASES))
async def test_resumed_run_sends_byte_identical_requests(name: str, tmp_path: Path) -> None:
    make, responses = CASES[name]
    store = keel.Store(tmp_path / "runs.sqlite")

    straight = Recorder(*responses())
    done = await agent(make(straight.http()), store, approve_tools=["fetch"]).arun("Which?")
    assert done.status == "completed"

    first = Recorder(*responses()[:1])
    paused = await agent(make(first.http()), store).arun("Which?")
    assert paused.status == "awaiting_approval"
    store.decide(paused.run_id, paused.pending_approvals[0].call_id, approved=True, by="ana")
    second = Recorder(*responses()[1:])  # a fresh agent and transport, as in a new process
    resumed = await agent(make(second.http()), store).aresume(paused.run_id)

    assert resumed.status == "completed"
    # Each run's requests carry its own id as the provider cache key (ADR 0021); past that,
    # the resumed run sends the bytes the uninterrupted one did.
    assert same_but_the_run(first.sent + second.sent, paused.run_id) == same_but_the_run(
        straight.sent, done.run_id
    )


def same_but_the_run(sent: list[httpx.Request], run_id: str) -> list[bytes]:
    return [r.content.replace(run_id.encode(), b"<the run's id>") for r in sent]


async def test_resumed_xml_script_run_sends_the_same_text_requests(tmp_path: Path) -> None:
    """`xml:script:`: the text requests the wrapped model reads, before and after a pause."""
    calls = '<call name="fetch">{"url": "https://example.org/a"}</call>'
    script = {"turns": [{"text": calls}, {"text": "The loop checkpoints every step."}]}
    store = keel.Store(tmp_path / "runs.sqlite")

    def xml_script() -> tuple[Transport, ScriptedTransport]:
        inner = ScriptedTransport.from_dict(script, record=True)
        return XmlFallbackTransport(inner), inner

    straight, straight_inner = xml_script()
    done = await agent(straight, store, approve_tools=["fetch"]).arun("Which?")
    assert done.status == "completed"

    first, first_inner = xml_script()
    paused = await agent(first, store).arun("Which?")
    assert paused.status == "awaiting_approval"
    store.decide(paused.run_id, paused.pending_approvals[0].call_id, approved=True, by="ana")
    second, second_inner = xml_script()
    resumed = await agent(second, store).aresume(paused.run_id)

    assert resumed.status == "completed"
    resumed_requests = first_inner.requests + second_inner.requests
    assert {r.cache_key for r in resumed_requests} == {paused.run_id}  # the run's own key
    assert [dataclasses.replace(r, cache_key=None) for r in resumed_requests] == [
        dataclasses.replace(r, cache_key=None) for r in straight_inner.requests
    ]
