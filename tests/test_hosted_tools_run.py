"""Provider-hosted tools in a run (ADR 0067), through the real Anthropic SDK under an
``httpx.MockTransport``: their calls recorded as events, counted as tool calls and priced per
call, counted by the repeat tiers, kept in the history a resumed run sends, and refused where
they cannot be kept."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from rich.console import Console

import keel
from contract import hosted_shapes as shapes
from keel._run.fork import prefix_of_run
from keel.assemble import agent_from_options
from keel.errors import ConfigError
from keel.hosted import HostedTool
from keel.limits import Limits
from keel.present.timeline import timeline
from keel.pricing import PriceTable
from keel.records import HostedToolCalled, ModelResponseReceived
from keel.transports.anthropic import AnthropicTransport

MODEL = "claude-sonnet-4-6"


@keel.tool
def page(n: int) -> str:
    """Read page n of the notes."""
    return f"page {n}: retry with backoff"


@keel.tool(effect="side_effecting", requires_approval=True)
def publish(text: str) -> str:
    """Publish the text."""
    return "published"


class Provider:
    """The Messages API under the SDK: answers in order, keeps every request body."""

    def __init__(self, *answers: dict[str, Any]) -> None:
        self.answers = list(answers)
        self.bodies: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.bodies.append(json.loads(request.content))
        return httpx.Response(200, json=self.answers.pop(0))

    def transport(self, *hosted: HostedTool) -> AnthropicTransport:
        http = httpx.AsyncClient(transport=httpx.MockTransport(self))
        return AnthropicTransport(
            MODEL, http_client=http, api_key="sk-ant-api03-run-test", hosted_tools=hosted
        )


def use(n: int, name: str = "page", **arguments: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": f"toolu_01K{n}", "name": name, "input": arguments or {"n": n}}


def search(n: int, query: str) -> list[dict[str, Any]]:
    """One web search that finds the two pages of `shapes.SEARCH_RESULT`."""
    call_id = f"srvtoolu_01R{n}"
    return [
        {**shapes.SEARCH_USE, "id": call_id, "input": {"query": query}},
        {**shapes.SEARCH_RESULT, "tool_use_id": call_id},
    ]


async def test_hosted_calls_are_recorded_counted_and_priced() -> None:
    provider = Provider(shapes.anthropic_message(shapes.ANTHROPIC_CONTENT))
    transport = provider.transport(HostedTool("web_search"), HostedTool("web_fetch"))
    store = keel.Store(":memory:")
    result = await keel.Agent(transport, tools=[page], store=store).arun("When to retry a 503?")
    assert result.status == "completed" and result.answer == shapes.ANSWER
    events = store.events(result.run_id)
    hosted = [e for e in events if isinstance(e, HostedToolCalled)]
    assert [(e.name, e.input, e.sources, e.error, e.cost) for e in hosted] == [
        ("web_search", "HTTP 503 Retry-After semantics", (shapes.RFC_URL, shapes.MDN_URL),
         None, 0.01),
        ("web_fetch", shapes.RFC_URL, (shapes.RFC_URL,), None, 0.0),
        ("web_search", "Retry-After header 503 RFC", (), "max_uses_exceeded", 0.0),
    ]  # fmt: skip
    response = next(e for e in events if isinstance(e, ModelResponseReceived))
    assert events.index(response) < events.index(hosted[0])  # after the turn that made them
    tokens = (10_412 * 3.0 + 236 * 15.0) / 1_000_000
    assert response.cost == pytest.approx(tokens)
    assert result.cost == pytest.approx(tokens + 0.01)  # one billed search on top
    assert result.tool_calls == 3  # the provider's calls are the run's tool calls
    cited = {"url": shapes.RFC_URL, "title": "RFC 9110: HTTP Semantics", "cited_text": shapes.CITED}
    assert result.sources == (cited,)  # kept with the answer
    assert result.to_dict()["sources"] == [cited]
    stored = store.get_run(result.run_id)
    assert stored is not None and stored.state.result(result.run_id).sources == (cited,)
    shown = Console(width=220, record=True)
    shown.print(timeline(events))  # what `keel show` prints
    text = shown.export_text()
    searched = "web_search by the provider: 'HTTP 503 Retry-After semantics' · 2 sources"
    assert f"hosted tool call  {searched} · $0.0100" in text
    assert "by the provider: 'Retry-After header 503 RFC' · max_uses_exceeded · $0.0000" in text
    store.close()


async def test_hosted_calls_spend_the_tool_call_budget() -> None:
    """Three hosted calls against a budget of two: Keel's own call in the same turn is not run
    and the next turn is the synthesis turn, its history holding the server blocks."""
    first = [*shapes.ANTHROPIC_CONTENT[:7], use(1)]
    provider = Provider(
        shapes.anthropic_message(first, "tool_use"),
        shapes.anthropic_message([{"type": "text", "text": "Retry after the delay."}]),
    )
    transport = provider.transport(HostedTool("web_search"), HostedTool("web_fetch"))
    limits = Limits(max_tool_calls=2)
    agent = keel.Agent(transport, tools=[page], limits=limits, store=":memory:")
    result = await agent.arun("q")
    assert result.status == "completed" and result.synthesized == "budget"
    second = provider.bodies[1]
    assert second["tool_choice"] == {"type": "none"}
    assert second["messages"][1]["content"][:7] == shapes.ANTHROPIC_CONTENT[:7]


@pytest.mark.parametrize("tier", [True, False], ids=["same_result", "without_the_tier"])
async def test_reworded_hosted_searches_with_the_same_hits_bring_the_synthesis_turn(
    tier: bool,
) -> None:
    queries = ["retry 503", "when to retry HTTP 503"]
    answers = [shapes.anthropic_message([*search(n, q), use(n)], "tool_use")
               for n, q in enumerate(queries)]  # fmt: skip
    answers.append(shapes.anthropic_message([{"type": "text", "text": "Back off."}]))
    provider = Provider(*answers)
    limits = Limits(loop_threshold=3, repeat_same_result=tier)
    transport = provider.transport(HostedTool("web_search"))
    agent = keel.Agent(transport, tools=[page], limits=limits, store=":memory:")
    result = await agent.arun("q")
    assert result.status == "completed"
    choices = [body.get("tool_choice") for body in provider.bodies]
    if tier:  # two searches found the same pages: T-1, so the third turn only answers
        assert choices == [None, None, {"type": "none"}]
        assert result.synthesized == "repeated_tool"
    else:
        assert choices == [None, None, None]


async def test_a_resumed_run_sends_the_server_blocks_back_as_received(tmp_path: Path) -> None:
    content = [*search(1, "retry 503"), {"type": "text", "text": "Publishing."},
               use(2, "publish", text="retry later")]  # fmt: skip
    store = keel.Store(tmp_path / "runs.sqlite")
    before = Provider(shapes.anthropic_message(content, "tool_use"))
    agent = keel.Agent(before.transport(HostedTool("web_search")), tools=[publish], store=store)
    paused = await agent.arun("q")
    assert paused.status == "awaiting_approval"
    agent.approve(paused.run_id)
    after = Provider(shapes.anthropic_message([{"type": "text", "text": "Done."}]))
    again = keel.Agent(after.transport(HostedTool("web_search")), tools=[publish], store=store)
    resumed = await again.aresume(paused.run_id)
    assert resumed.status == "completed"
    assert after.bodies[0]["messages"][1]["content"] == content
    hosted = [e for e in store.events(paused.run_id) if isinstance(e, HostedToolCalled)]
    assert len(hosted) == 1  # recorded once, never re-run
    tokens = (10_412 * 3.0 + 236 * 15.0) / 1_000_000  # each answer's usage, priced
    assert paused.cost == pytest.approx(tokens + 0.01)
    assert resumed.cost == pytest.approx(2 * tokens + 0.01)  # the search billed once
    store.close()


def test_agent_takes_hosted_tools_with_a_spec_and_refuses_what_it_cannot_keep(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-api03-run-test")
    agent = keel.Agent(f"anthropic:{MODEL}", hosted_tools=["web_search:max_uses=2"])
    assert agent.transport.hosted_tools == (HostedTool("web_search", max_uses=2),)  # type: ignore[attr-defined]

    @keel.tool
    def web_search(query: str) -> str:
        """Search."""
        return ""

    with pytest.raises(ConfigError, match="have one name"):
        keel.Agent(f"anthropic:{MODEL}", tools=[web_search], hosted_tools=["web_search"])
    unpriced = PriceTable.shipped().merged(PriceTable(hosted={}))
    no_search_price = PriceTable(unpriced.prices, unpriced.date, {"anthropic": {}})
    with pytest.raises(ConfigError, match="no price per call is known for the hosted tool"):
        keel.Agent(
            f"anthropic:{MODEL}",
            hosted_tools=["web_search"],
            limits=Limits(max_cost=1.0),
            prices=no_search_price,
        )
    with pytest.raises(ConfigError, match="a transport passed in declares its own"):
        keel.Agent(keel.ScriptedTransport.from_dict({"turns": []}), hosted_tools=["web_search"])


def test_the_hosted_tool_option_is_saved_with_the_run_and_rebuilds_the_transport(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-api03-run-test")
    monkeypatch.chdir(tmp_path)
    agent = agent_from_options(
        model=f"anthropic:{MODEL}",
        hosted_tool=["web_search:domains=rfc-editor.org", "web_fetch"],
        store=str(tmp_path / "runs.sqlite"),
        repo=tmp_path,
    )
    assert agent.transport.hosted_tools == (  # type: ignore[attr-defined]
        HostedTool("web_search", domains=("rfc-editor.org",)),
        HostedTool("web_fetch"),
    )
    assert agent.run_config["hosted_tools"] == ["web_search:domains=rfc-editor.org", "web_fetch"]


async def test_a_fork_counts_the_hosted_calls_as_the_original_did(tmp_path: Path) -> None:
    """The breaker's counters, the spend and the tool calls of a fork's prefix are the
    original's: the fork counts the recorded hosted calls with the loop's own code."""
    answers = [
        shapes.anthropic_message([*search(1, "retry 503"), use(1)], "tool_use"),
        shapes.anthropic_message([*search(2, "503 retry"), use(2)], "tool_use"),
        shapes.anthropic_message([{"type": "text", "text": "Back off."}]),
    ]
    store = keel.Store(tmp_path / "runs.sqlite")
    limits = Limits(repeat_same_result=True)
    provider = Provider(*answers)
    agent = keel.Agent(
        provider.transport(HostedTool("web_search")), tools=[page], limits=limits, store=store
    )
    original = await agent.arun("q")
    stored = store.get_run(original.run_id)
    assert original.status == "completed" and stored is not None
    prefix = prefix_of_run(store, original.run_id, 2)  # the last step before the answer
    assert prefix.counters == store.counters(original.run_id)
    assert "~same_result web_search" in prefix.counters
    assert prefix.counters["~same_result web_search"].count == 2
    mine, theirs = prefix.state, stored.state
    answer_turn = (10_412 * 3.0 + 236 * 15.0) / 1_000_000  # not in the prefix
    assert mine.tool_calls == theirs.tool_calls == 4  # two searches, two pages
    assert mine.cost == pytest.approx(theirs.cost - answer_turn)
    store.close()


def test_a_working_directory_keel_toml_needs_hosted_tools_granted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A repository's keel.toml that declares hosted tools would spend the user's money at
    the provider: trusting the file does not grant them, `--grant hosted_tools` does."""
    from keel.config import config_files, trust

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "keel.toml").write_text(
        'model = "anthropic:claude-sonnet-4-6"\nhosted_tools = ["web_search"]\n'
    )
    trust(repo)
    (used,), warnings = config_files(repo)
    assert set(used.data) == {"model"}
    assert any("hosted_tools" in w and "--grant" in w for w in warnings)
    trust(repo, grant=["hosted_tools"])
    (used,), _ = config_files(repo)
    assert used.data["hosted_tools"] == ["web_search"]


def test_keel_run_prints_the_sources_after_the_answer() -> None:
    import io

    from keel.cli.finish import print_result
    from keel.cli.output import Stdout
    from keel.messages import Usage
    from keel.result import RunResult

    source = {"url": shapes.RFC_URL, "title": "RFC 9110: HTTP Semantics", "cited_text": "x"}
    result = RunResult(
        "run_1", "completed", "Back off.", None, None, 1, 1, Usage(), sources=(source,)
    )
    stream = io.StringIO()
    print_result(result, False, Stdout(stream))
    assert stream.getvalue() == (
        f"Back off.\nSources:\n[1] RFC 9110: HTTP Semantics: {shapes.RFC_URL}\n"
    )


async def test_openai_hosted_calls_are_recorded_and_priced_in_a_run() -> None:
    from keel.transports.openai_responses import OpenAIResponsesTransport

    answer = {
        "id": "resp_68af40a0a1b28193",
        "object": "response",
        "status": "completed",
        "model": "gpt-5-mini-2025-08-07",
        "output": shapes.OPENAI_OUTPUT,
        "usage": {"input_tokens": 9_120, "output_tokens": 310},
    }
    bodies: list[dict[str, Any]] = []

    def provider(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(200, json=answer)

    transport = OpenAIResponsesTransport(
        "gpt-5-mini",
        http_client=httpx.AsyncClient(transport=httpx.MockTransport(provider)),
        api_key="sk-proj-run-test",
        hosted_tools=[HostedTool("web_search"), HostedTool("file_search", stores=("vs_1",))],
    )
    store = keel.Store(":memory:")
    result = await keel.Agent(transport, tools=[page], store=store).arun("q")
    assert result.status == "completed" and result.answer == shapes.ANSWER
    hosted = [e for e in store.events(result.run_id) if isinstance(e, HostedToolCalled)]
    assert [(e.name, e.sources, e.cost) for e in hosted] == [
        ("web_search", (shapes.RFC_URL, shapes.MDN_URL), 0.01),
        ("file_search", (), 0.0025),
    ]
    tokens = (9_120 * 0.25 + 310 * 2.0) / 1_000_000  # gpt-5-mini's price
    assert result.cost == pytest.approx(tokens + 0.0125)
    assert result.tool_calls == 2
    assert [s["url"] for s in result.sources] == [shapes.RFC_URL]
    store.close()
