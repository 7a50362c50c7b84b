"""The provider's prompt cache, end to end (ADR 0021): one cache key per run, kept across a
resume; `keel show` reports the share of input that repeated the previous request, and the
provider's own cached count where it reports one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

import keel
from keel.present.timeline import prompt_cache_share, timeline
from keel.transports.anthropic import AnthropicTransport
from support import call, run_script


@keel.tool(effect="read_only")
def page(n: int) -> str:
    """Read page n."""
    return f"page {n} " + "lorem ipsum " * 800


@keel.tool(effect="side_effecting", requires_approval=True)
def publish(text: str) -> str:
    """Publish the text."""
    return "published"


async def test_every_request_of_a_run_carries_the_run_id_as_its_cache_key_across_a_resume(
    tmp_path: Path,
) -> None:
    turns = [call("page", n=0), call("publish", text="x"), call("page", n=1), {"text": "done"}]
    store = keel.Store(tmp_path / "runs.sqlite")
    first = keel.ScriptedTransport.from_dict({"turns": turns}, record=True)
    agent = keel.Agent(first, tools=[page, publish], store=store)
    paused = await agent.arun("q")
    assert paused.status == "awaiting_approval"
    agent.approve(paused.run_id)
    second = keel.ScriptedTransport.from_dict({"turns": turns}, record=True)
    resumed = keel.Agent(second, tools=[page, publish], store=store)
    assert (await resumed.aresume(paused.run_id)).status == "completed"
    keys = {r.cache_key for r in first.requests + second.requests}
    assert keys == {paused.run_id}
    store.close()


async def test_keel_show_ends_with_the_share_of_input_that_repeated_the_previous_request() -> None:
    turns = [call("page", n=i) for i in range(8)] + [{"text": "done"}]
    out = await run_script({"turns": turns}, [page], context_tokens=6_000)
    share = prompt_cache_share(out.events)
    assert share is not None and share.requests == 9
    sent = out.requests
    assert share.estimated_tokens == sum(r.estimated_input_tokens for r in sent)
    assert share.repeated_tokens == sum(r.repeated_prefix_tokens for r in sent) > 0
    shown = Console(width=200, record=True)
    shown.print(timeline(out.events))
    assert (
        f"prompt cache: {share.share:.0%} of the input tokens of 9 requests" in shown.export_text()
    )


def _message(content: list[dict[str, Any]], stop: str, cached: int) -> httpx.Response:
    usage = {"input_tokens": 100, "cache_read_input_tokens": cached, "output_tokens": 5}
    return httpx.Response(
        200,
        json={
            "id": "msg_01XFDUDYJgAACzvnptvVoYEL",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4-6",
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": usage,
        },
    )


async def test_the_providers_reported_cached_tokens_are_shown_beside_the_estimate() -> None:
    use = {"type": "tool_use", "id": "toolu_1", "name": "page", "input": {"n": 1}}
    answers = [
        _message([use], "tool_use", 0),
        _message([{"type": "text", "text": "done"}], "end_turn", 300),
    ]
    sent: list[dict[str, Any]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return answers.pop(0)

    http = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    transport = AnthropicTransport("claude-sonnet-4-6", http_client=http, api_key="sk-ant-test")
    store = keel.Store(":memory:")
    result = await keel.Agent(transport, tools=[page], store=store).arun("q")
    share = prompt_cache_share(store.events(result.run_id))
    assert share is not None
    assert (share.provider_tokens, share.provider_cached) == (100 + 400, 300)
    assert (
        "the model reported 60% of its 500 input tokens served from its cache" in share.describe()
    )
    # the second request asked to cache the first one's history, tools and system included
    assert "cache_control" in sent[1]["system"][0] and "cache_control" in sent[1]["tools"][-1]
    store.close()
