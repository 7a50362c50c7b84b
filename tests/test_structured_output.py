"""Structured output: the answer in the caller's shape, validated, even when a limit forced it
(ADR 0034).

Each provider is sent the schema in its own wire form, checked on the request its real SDK
sent; the answer is validated with pydantic (a model) or the JSON Schema validator (a dict); an
invalid answer gets its errors and another turn; a synthesis turn asks for the same schema in
an envelope with the gaps and comes back `partial`; an answer that never validates fails the
run InvalidOutput with the model's text, never an exception out of `agent.run`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pydantic
import pytest
from typer.testing import CliRunner

import keel
from contract import case_anthropic, case_openai_chat, case_openai_responses
from contract.harness import Recorder
from keel._run.synthesis import PARTIAL_OUTPUT_CONTROL
from keel.cli.app import app
from keel.messages import ModelRequest, OutputSchema, ToolDefinition, UserMessage
from keel.records import OutputRejected, RunCompleted
from keel.structured import OutputSpec
from keel.tools.base import Effect, make_tool
from keel.transports.anthropic import ANSWER_TOOL
from keel.transports.local.grammar import turn_grammar
from keel.transports.scripted import ScriptedTransport
from keel.transports.xml_fallback import to_text_request
from support import call


class Finding(pydantic.BaseModel):
    module: str
    depends_on: list[str]
    confident: bool


FINDING = {"module": "loop", "depends_on": ["breaker", "budgets"], "confident": True}
PARTIAL = {"output": {**FINDING, "confident": False}, "gaps": ["the store was not read"]}
SCHEMA = Finding.model_json_schema()


@keel.tool
def fetch(url: str) -> str:
    """Download a web page as text."""
    return f"page {url}"


@keel.tool
def read_file(path: str) -> str:
    """Read a file of the repository."""
    return f"file {path}"


# --- each provider's wire form, on the request its real SDK sent ------------------------------


def responses_answer(value: Any) -> httpx.Response:
    message = {
        "id": "msg_68af4033d1a8819388a8c2d7a6ad2f2505438e46b5f69a3b",
        "type": "message",
        "status": "completed",
        "role": "assistant",
        "content": [
            {"type": "output_text", "annotations": [], "logprobs": [], "text": json.dumps(value)}
        ],
    }
    usage = {"input_tokens": 300, "input_tokens_details": {"cached_tokens": 0},
             "output_tokens": 30, "output_tokens_details": {"reasoning_tokens": 0},
             "total_tokens": 330}  # fmt: skip
    return case_openai_responses._response([message], usage)


def chat_answer(value: Any) -> httpx.Response:
    return case_openai_chat._completion(
        {"content": json.dumps(value)}, "stop", case_openai_chat._usage(300, 0, 30)
    )


def anthropic_answer(value: Any) -> httpx.Response:
    block = {"type": "tool_use", "id": "toolu_01A", "name": ANSWER_TOOL, "input": value}
    usage = {"input_tokens": 300, "cache_creation_input_tokens": 0,
             "cache_read_input_tokens": 0, "output_tokens": 30}  # fmt: skip
    return case_anthropic._message([block], "tool_use", usage)


async def partial_run_over(case: Any, answer: Any) -> tuple[keel.RunResult, Recorder]:
    """A run whose budget allows two model calls: research, then the synthesis turn."""
    server = Recorder(case.tool_calls_response(), answer(PARTIAL))
    agent = keel.Agent(
        case.make(server.http()),
        tools=[fetch, read_file],
        store=keel.Store(":memory:"),
        limits=keel.Limits(max_model_calls=2),
        output_type=Finding,
    )
    return await agent.arun("Which modules does the run loop depend on?"), server


def envelope_of(schema: dict[str, Any]) -> dict[str, Any]:
    assert schema["required"] == ["output", "gaps"]
    return dict(schema["properties"]["output"])


async def test_openai_responses_sends_the_schema_as_text_format_and_the_partial_answer_validates() -> None:  # noqa: E501
    result, server = await partial_run_over(case_openai_responses.CASE, responses_answer)
    first, last = server.body(0), server.body(1)
    assert first["text"] == {"format": {"type": "json_schema", "name": "Finding",
                                        "schema": SCHEMA, "strict": False}}  # fmt: skip
    fmt = last["text"]["format"]
    assert fmt["type"] == "json_schema" and fmt["name"] == "Finding_partial"
    assert envelope_of(fmt["schema"]) == {k: v for k, v in SCHEMA.items() if k != "$defs"}
    assert last["tool_choice"] == "none"
    assert_partial(result)


async def test_openai_chat_sends_the_schema_as_response_format_and_the_partial_answer_validates() -> None:  # noqa: E501
    result, server = await partial_run_over(case_openai_chat.CASE, chat_answer)
    first, last = server.body(0), server.body(1)
    assert first["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "Finding", "schema": SCHEMA, "strict": False},
    }
    assert last["response_format"]["json_schema"]["name"] == "Finding_partial"
    assert last["tool_choice"] == "none"
    assert_partial(result)


async def test_anthropic_is_given_an_answer_tool_forced_in_synthesis_and_the_partial_answer_validates() -> None:  # noqa: E501
    result, server = await partial_run_over(case_anthropic.CASE, anthropic_answer)
    first, last = server.body(0), server.body(1)
    answer_tool = first["tools"][-1]
    assert answer_tool["name"] == ANSWER_TOOL and answer_tool["input_schema"] == SCHEMA
    assert "tool_choice" not in first  # research or answer: the model's choice
    assert last["tools"][-1]["name"] == ANSWER_TOOL
    assert envelope_of(last["tools"][-1]["input_schema"]) == SCHEMA
    assert last["tool_choice"] == {"type": "tool", "name": ANSWER_TOOL}
    assert_partial(result)


def assert_partial(result: keel.RunResult) -> None:
    assert result.status == "completed" and result.synthesized == "budget"
    assert isinstance(result.output, Finding)
    assert result.output == Finding.model_validate(PARTIAL["output"])
    assert result.partial is True and result.gaps == ("the store was not read",)
    shown = result.to_dict()
    assert shown["output"] == PARTIAL["output"] and shown["partial"] is True
    assert shown["gaps"] == ["the store was not read"]


def test_the_xml_fallback_asks_for_the_schema_in_words() -> None:
    request = ModelRequest("sys", (), (UserMessage("q"),), output=OutputSchema("Finding", SCHEMA))
    text = to_text_request(request)
    assert text.output is None  # the inner model stays free to write call blocks
    assert "reply with only a JSON value" in text.volatile[-1]
    assert json.dumps(SCHEMA, sort_keys=True) in text.volatile[-1]


def test_the_local_models_grammar_is_built_from_the_schema() -> None:
    url = {"type": "object", "properties": {"url": {"type": "string"}}}
    tool = ToolDefinition("fetch", "Fetch.", url)
    free = turn_grammar((tool,), None)
    shaped = turn_grammar((tool,), None, SCHEMA)
    synthesis = turn_grammar((), "none", SCHEMA)
    assert "answer ::= [^<{`" in free
    assert "answer ::= [^<{`" not in shaped and '\\"depends_on\\"' in shaped
    assert "call" not in synthesis and '\\"module\\"' in synthesis


def test_the_local_models_grammar_accepts_the_schema_and_refuses_prose(
    local_transport: Any,
) -> None:
    from test_local_grammar import accepts

    grammar = turn_grammar((), "none", SCHEMA)
    good = '{"module": "loop", "depends_on": ["breaker"], "confident": true}'
    assert accepts(local_transport, grammar, good)
    assert not accepts(local_transport, grammar, "The loop depends on the breaker.")
    assert not accepts(local_transport, grammar, '{"module": "loop"}')


# --- validation, retries, the forced answer, InvalidOutput --------------------------------------


def scripted_agent(script: dict[str, Any], output: Any = Finding, **limits: Any) -> keel.Agent:
    transport = ScriptedTransport.from_dict(script, record=True)
    return keel.Agent(transport, tools=[fetch], store=keel.Store(":memory:"),
                      limits=keel.Limits(**limits), output_type=output)  # fmt: skip


async def test_a_valid_answer_is_the_validated_output() -> None:
    agent = scripted_agent({"turns": [{"text": "```json\n" + json.dumps(FINDING) + "\n```"}]})
    result = await agent.arun("q")
    assert result.status == "completed" and result.synthesized is None
    assert result.output == Finding(**FINDING) and result.partial is False


async def test_an_invalid_answer_gets_its_errors_and_one_more_turn() -> None:
    script = {"turns": [{"text": '{"module": "loop"}'}, {"text": json.dumps(FINDING)}]}
    agent = scripted_agent(script)
    result = await agent.arun("q")
    assert result.status == "completed" and result.output == Finding(**FINDING)
    assert result.model_calls == 2  # the retry is a model call against the budget
    (rejected,) = [e for e in agent.store.events(result.run_id) if isinstance(e, OutputRejected)]
    assert "depends_on" in rejected.feedback and rejected.text == '{"module": "loop"}'
    assert isinstance(agent.transport, ScriptedTransport)
    second = agent.transport.requests[1]
    assert second.items[-1] == UserMessage(rejected.feedback)


async def test_an_answer_that_never_validates_fails_invalid_output_with_the_text() -> None:
    script = {"turns": [{"text": "no JSON here"}] * 3}
    result = await scripted_agent(script, output_retries=2).arun("q")
    assert result.status == "failed"
    assert result.failure is not None and result.failure.kind == "InvalidOutput"
    assert result.failure.details["text"] == "no JSON here"
    assert "after 2 retries" in result.failure.message
    assert result.output is None


async def test_each_output_retry_is_counted_once() -> None:
    """The ledger counts an `output_rejected` event as it is recorded; the step does not count
    it again, so `output_retries=2` gives two more turns (issue 43: it had given one)."""
    script = {"turns": [{"text": "no JSON here"}] * 3}
    agent = scripted_agent(script, output_retries=2)
    result = await agent.arun("q")
    assert result.model_calls == 3
    rejected = [e for e in agent.store.events(result.run_id) if isinstance(e, OutputRejected)]
    assert len(rejected) == 2


async def test_a_synthesis_answer_that_does_not_validate_fails_invalid_output() -> None:
    script = {"turns": [call("fetch", url="a")], "on_synthesis": {"text": '{"output": {}}'}}
    result = await scripted_agent(script, max_model_calls=2).arun("q")
    assert result.failure is not None and result.failure.kind == "InvalidOutput"
    assert result.failure.details["synthesis"] == "budget"
    assert result.failure.details["text"] == '{"output": {}}'


async def test_a_synthesis_turn_asks_for_the_envelope_with_its_control() -> None:
    script = {"turns": [call("fetch", url="a")], "on_synthesis": {"text": json.dumps(PARTIAL)}}
    agent = scripted_agent(script, max_model_calls=2)
    result = await agent.arun("q")
    assert result.partial and result.output == Finding.model_validate(PARTIAL["output"])
    assert isinstance(agent.transport, ScriptedTransport)
    last = agent.transport.requests[-1]
    assert last.output is not None and last.output.partial
    assert last.volatile[-1] == PARTIAL_OUTPUT_CONTROL
    done = [e for e in agent.store.events(result.run_id) if isinstance(e, RunCompleted)]
    assert done[0].partial and done[0].output == PARTIAL["output"]


async def test_a_json_schema_dict_is_validated_by_the_json_schema_validator() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}},
              "required": ["n"]}  # fmt: skip
    script = {"turns": [{"text": '{"n": 0}'}, {"text": '{"n": 3}'}]}
    result = await scripted_agent(script, output=schema).arun("q")
    assert result.output == {"n": 3} and result.model_calls == 2


def test_a_schema_that_is_not_json_schema_is_refused() -> None:
    with pytest.raises(keel.ConfigError, match="not a valid JSON Schema"):
        OutputSpec.of({"type": "no-such-type"})


# --- the command line, and a resume that keeps the schema ------------------------------------


def test_keel_run_output_schema_and_resume_keep_the_schema(tmp_path: Path) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    schema_file = tmp_path / "schema.json"
    schema_file.write_text(json.dumps(schema))
    repo = tmp_path / "repo"
    repo.mkdir()
    write = {"tool_calls": [{"name": "write_file", "arguments": {"path": "a.txt", "content": "x"}}]}
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": [write, {"text": "not json"}, {"text": '{"n": 7}'}]}))
    db = str(tmp_path / "r.db")
    runner = CliRunner()
    out = runner.invoke(app, ["run", "q", "--model", f"script:{script}", "--store", db,
                              "--repo", str(repo), "--allow-writes", "--output-schema",
                              str(schema_file), "--json"])  # fmt: skip
    paused = json.loads(out.stdout)
    assert paused["status"] == "awaiting_approval", out.stderr
    run_id = paused["run_id"]
    assert runner.invoke(app, ["approve", run_id, "--all", "--store", db]).exit_code == 0
    resumed = runner.invoke(app, ["resume", run_id, "--store", db, "--json"])
    result = json.loads(resumed.stdout)
    assert result["status"] == "completed", resumed.stderr
    assert result["output"] == {"n": 7} and result["partial"] is False


def test_an_output_schema_file_that_is_not_json_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "schema.json"
    bad.write_text("{not json")
    out = CliRunner().invoke(app, ["run", "q", "--model", "script:x.json", "--output-schema",
                                   str(bad)])  # fmt: skip
    assert out.exit_code == 2 and "--output-schema" in out.stderr


async def test_a_run_paused_with_a_schema_resumes_validating_it_with_another_agent(
    tmp_path: Path,
) -> None:
    """The schema is stored with the run's settings: an agent built without it still asks for
    and validates the same shape."""

    def publish_text(text: str) -> str:
        """Publish text."""
        return "ok"

    publish = make_tool(publish_text, name="publish", effect=Effect.SIDE_EFFECTING,
                        requires_approval=True)  # fmt: skip
    script = {"turns": [call("publish", text="x"), {"text": json.dumps(FINDING)}]}
    store = keel.Store(tmp_path / "r.db")
    first = keel.Agent(ScriptedTransport.from_dict(script), tools=[publish], store=store,
                       output_type=Finding)  # fmt: skip
    paused = await first.arun("q")
    first.approve(paused.run_id, "k1_0", by="t")
    transport = ScriptedTransport.from_dict(script, record=True)
    other = keel.Agent(transport, tools=[publish], store=store)
    done = await other.aresume(paused.run_id)
    assert done.status == "completed" and done.output == FINDING
    assert transport.requests[-1].output == OutputSchema("Finding", SCHEMA)


def test_keel_ui_and_keel_show_show_the_rejected_answer_and_the_structured_output(
    tmp_path: Path,
) -> None:
    from starlette.testclient import TestClient

    from keel.ui.app import create_app
    from keel.ui.security import served_hosts

    db = tmp_path / "runs.sqlite"
    script = {"turns": [{"text": '{"module": "loop"}'}, {"text": json.dumps(FINDING)}]}
    with keel.Agent(ScriptedTransport.from_dict(script), store=db, output_type=Finding) as agent:
        result = agent.run("q")
    with TestClient(create_app(db, served_hosts("127.0.0.1", 8350)),
                    base_url="http://127.0.0.1:8350") as ui:  # fmt: skip
        page = ui.get(f"/runs/{result.run_id}").text
    assert "answer rejected" in page and "depends_on" in page
    assert "structured output" in page
    shown = CliRunner().invoke(app, ["show", result.run_id, "--store", str(db)])
    assert "answer rejected by the output schema" in shown.stdout
