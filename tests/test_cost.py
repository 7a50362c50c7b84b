"""What a run costs, and a cost limit that ends in an answer (ADR 0033).

Each model call is priced from its recorded usage (cached input at the cached price) with the
price table Keel ships, keel.toml's [prices] or a table given in code; the run's cost is their
sum. A cost limit is a budget like the others: the call that could pass it is synthesis-only,
and past it the run fails BudgetExhausted naming the cost. A model with no known price and a
cost limit is refused at the start.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import keel
from keel._run.budgets import Clock, past_limits
from keel._run.synthesis import BUDGET_CONTROL
from keel.cli.app import app
from keel.messages import Usage
from keel.pricing import FREE, Price, PriceTable, call_cost, configured_prices
from keel.records import ModelRequestSent, ModelResponseReceived, RunState
from keel.transports.scripted import ScriptedTransport
from support import call

ANSWER = {"text": "What the notes show; research stopped at the cost budget."}
GPT_4O = PriceTable.shipped().lookup("openai:gpt-4o")


@keel.tool
def note(topic: str) -> str:
    """Read the note on a topic."""
    return f"note about {topic} " * 20


def notes(n: int) -> list[dict[str, Any]]:
    return [call("note", topic=f"t{i}") for i in range(n)]


def priced_script(turns: list[dict[str, Any]], model: str = "openai:gpt-4o") -> dict[str, Any]:
    return {"turns": turns, "on_synthesis": ANSWER, "model": model}


async def run(script: dict[str, Any], **limits: Any) -> tuple[keel.RunResult, keel.Store]:
    store = keel.Store(":memory:")
    transport = ScriptedTransport.from_dict(script, record=True)
    agent = keel.Agent(transport, tools=[note], store=store, limits=keel.Limits(**limits))
    return await agent.arun("q"), store


async def test_a_cost_limit_reached_by_a_scripted_model_with_a_priced_name_ends_in_a_synthesized_answer_with_the_cost() -> None:  # noqa: E501
    result, store = await run(priced_script(notes(20)), max_cost=0.004)
    assert result.status == "completed" and result.synthesized == "budget"
    assert result.answer == ANSWER["text"]
    responses = [e for e in store.events(result.run_id) if isinstance(e, ModelResponseReceived)]
    assert GPT_4O is not None
    assert [e.cost for e in responses] == [call_cost(e.usage, GPT_4O) for e in responses]
    assert result.cost == pytest.approx(sum(e.cost or 0 for e in responses))
    assert 0 < result.cost < 0.004 + max(e.cost or 0 for e in responses) * 2
    assert result.to_dict()["cost_usd"] == result.cost
    assert 2 < result.model_calls < 20  # stopped by the cost, not by the script


async def test_the_call_that_could_pass_the_cost_limit_is_budget_synthesis() -> None:
    store = keel.Store(":memory:")
    transport = ScriptedTransport.from_dict(priced_script(notes(20)), record=True)
    agent = keel.Agent(transport, tools=[note], store=store, limits=keel.Limits(max_cost=0.004))
    result = await agent.arun("q")
    last = transport.requests[-1]
    assert last.tool_choice == "none" and last.volatile[1:] == (BUDGET_CONTROL,)
    events = store.events(result.run_id)
    costs = [e.cost or 0 for e in events if isinstance(e, ModelResponseReceived)]
    before_last = sum(costs[:-1])
    assert before_last + max(costs[:-1]) > 0.004  # the estimate said the next could pass it
    assert sum(costs[:-2]) + max(costs[:-2]) <= 0.004  # and the one before did not


def test_past_the_cost_limit_the_run_fails_budget_exhausted_naming_the_cost() -> None:
    """Past the limit (a synthesis turn's own retry, say) no further call goes out."""
    state = RunState(model_calls=2, cost=0.00042)
    stop = past_limits(state, keel.Limits(max_cost=0.0001), Clock())
    assert isinstance(stop, keel.BudgetExhausted) and stop.details["budget"] == "cost"
    assert "$0.0001" in stop.message and "$0.0004" in stop.message


async def test_a_first_call_that_alone_would_pass_the_cost_limit_is_synthesis_only() -> None:
    """Its own request is priced before it is sent (once, the run had no estimate before its
    first call, sent it, and failed with nothing to show)."""
    result, _ = await run(priced_script(notes(3)), max_cost=0.0001)
    assert result.status == "completed" and result.synthesized == "budget", result.failure
    assert (result.model_calls, result.tool_calls) == (1, 0)


def test_an_unpriced_model_with_a_cost_limit_exits_2_naming_the_model(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(priced_script(notes(1), model="openai:no-such-model")))
    out = CliRunner().invoke(
        app,
        ["run", "q", "--model", f"script:{script}", "--store", str(tmp_path / "r.db"),
         "--max-cost", "1"],
    )
    assert out.exit_code == 2
    assert "openai:no-such-model" in out.stderr
    assert "no price" in out.stderr


def test_an_unpriced_model_without_a_cost_limit_runs_and_says_its_cost_is_unknown(
    tmp_path: Path,
) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": [ANSWER], "model": "anthropic:claude-unknown"}))
    out = CliRunner().invoke(
        app, ["run", "q", "--model", f"script:{script}", "--store", str(tmp_path / "r.db"),
              "--json"],
    )
    assert out.exit_code == 0, out.stderr
    assert json.loads(out.stdout)["cost_usd"] is None


async def test_local_and_scripted_models_cost_nothing() -> None:
    table = PriceTable.shipped()
    assert table.lookup("local") == FREE and table.lookup("script:x.json") == FREE
    assert table.lookup("xml:local") == FREE
    result, _ = await run({"turns": [*notes(1), ANSWER]}, max_cost=0.01)
    assert result.status == "completed" and result.cost == 0.0


def test_cached_input_tokens_are_priced_as_cached() -> None:
    price = Price(input=2.0, cached_input=0.5, output=8.0)
    usage = Usage(input_tokens=1_000_000, output_tokens=100_000, cached_input_tokens=600_000)
    assert call_cost(usage, price) == pytest.approx(0.4 * 2.0 + 0.6 * 0.5 + 0.1 * 8.0)


def test_the_shipped_table_has_its_date_and_prices_both_providers() -> None:
    table = PriceTable.shipped()
    assert table.date
    assert table.lookup("openai:gpt-5-mini") is not None
    assert table.lookup("openai-chat:gpt-4o") == table.lookup("openai:gpt-4o")
    assert table.lookup("openai:gpt-4o-2024-08-06") == table.lookup("openai:gpt-4o")
    assert table.lookup("anthropic:claude-sonnet-4-5-20250929") is not None
    assert table.lookup("openai-chat:qwen") is None


def test_keel_toml_prices_override_the_shipped_table(tmp_path: Path) -> None:
    toml = tmp_path / "keel.toml"
    toml.write_text(
        '[prices.openai]\n"gpt-4o" = { input = 1.0, cached_input = 0.1, output = 2.0 }\n'
        '"my-tuned" = { input = 3.0, cached_input = 0.3, output = 6.0 }\n'
    )
    import tomllib

    table = configured_prices([(toml, tomllib.loads(toml.read_text()))])
    assert table.lookup("openai:gpt-4o") == Price(1.0, 0.1, 2.0)
    assert table.lookup("openai:my-tuned") == Price(3.0, 0.3, 6.0)
    assert table.lookup("openai:gpt-5-mini") == PriceTable.shipped().lookup("openai:gpt-5-mini")
    toml.write_text('[prices.openai]\n"bad" = { input = -1, cached_input = 0, output = 0 }\n')
    with pytest.raises(keel.ConfigError, match="bad"):
        configured_prices([(toml, tomllib.loads(toml.read_text()))])


async def test_prices_given_in_code_price_the_run() -> None:
    mine = PriceTable({"openai": {"house-model": Price(1000.0, 100.0, 1000.0)}})
    transport = ScriptedTransport.from_dict(priced_script([ANSWER], "openai:house-model"))
    agent = keel.Agent(transport, store=keel.Store(":memory:"), prices=mine,
                       limits=keel.Limits(max_cost=100))
    result = await agent.arun("q")
    assert result.cost is not None and result.cost > 0.01


def test_keel_show_and_keel_runs_print_the_cost(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(priced_script([*notes(1), ANSWER])))
    db = str(tmp_path / "r.db")
    out = CliRunner().invoke(app, ["run", "q", "--model", f"script:{script}", "--store", db,
                                   "--json"])
    result = json.loads(out.stdout)
    cost = f"${result['cost_usd']:.4f}"
    assert result["cost_usd"] > 0
    shown = CliRunner().invoke(app, ["show", result["run_id"], "--store", db])
    assert cost in shown.stdout
    listed = CliRunner().invoke(app, ["runs", "--store", db])
    assert cost in listed.stdout


def test_keel_ui_shows_the_cost_of_a_run_and_of_each_call(tmp_path: Path) -> None:
    from starlette.testclient import TestClient

    from keel.ui.app import create_app
    from keel.ui.security import served_hosts

    db = tmp_path / "runs.sqlite"
    transport = ScriptedTransport.from_dict(priced_script([*notes(1), ANSWER]))
    with keel.Agent(transport, tools=[note], store=db) as agent:
        result = agent.run("q")
    assert result.cost is not None
    app_ = create_app(db, served_hosts("127.0.0.1", 8350))
    with TestClient(app_, base_url="http://127.0.0.1:8350") as ui:
        page = ui.get(f"/runs/{result.run_id}").text
        listing = ui.get("/").text
    assert f'<dd id="cost">${result.cost:.4f}' in page
    assert page.count(" · $") >= 2  # each model response
    assert f"${result.cost:.4f}" in listing


@keel.tool
def long_note(topic: str) -> str:
    """Read the long note on a topic."""
    return f"a long note about {topic}, with its details " * 150


@pytest.mark.parametrize("max_cost", [0.004, 0.01, 0.02])
async def test_the_next_call_is_priced_from_its_own_request_so_a_run_ends_within_the_limit_plus_its_synthesis_estimate(  # noqa: E501
    max_cost: float,
) -> None:
    """Each result makes the next request longer, so the costliest call so far underprices
    the next one (a $0.02 limit ended at $0.0436, issue 37): the next call is priced from its
    own input tokens, counted before it is sent, and its output limit."""
    store = keel.Store(":memory:")
    script = {"turns": [call("long_note", topic=f"t{i}") for i in range(40)],
              "on_synthesis": ANSWER, "model": "openai:gpt-4o"}  # fmt: skip
    transport = ScriptedTransport.from_dict(script, record=True)
    limits = keel.Limits(max_cost=max_cost, max_model_calls=60)
    agent = keel.Agent(transport, tools=[long_note], store=store, limits=limits)
    result = await agent.arun("q")
    assert result.status == "completed" and result.synthesized == "budget", result.failure
    events = store.events(result.run_id)
    sent = [e for e in events if isinstance(e, ModelRequestSent)]
    costs = [e.cost or 0.0 for e in events if isinstance(e, ModelResponseReceived)]
    assert GPT_4O is not None and sent[-1].synthesis == "budget"
    synthesis_estimate = sent[-1].estimated_input_tokens * GPT_4O.input / 1_000_000
    assert sum(costs[:-1]) <= max_cost  # no call before the synthesis turn passed the limit
    assert result.cost is not None and result.cost <= max_cost + synthesis_estimate * 1.01
