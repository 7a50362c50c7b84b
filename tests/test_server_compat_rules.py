"""What Keel does for servers nobody on the project wrote (issue 23, ADR 0035), offline: the
real SDKs over an ``httpx.MockTransport`` and the real command line. The same paths run against
the real servers in `test_compat_servers.py`.

- an assistant turn with calls and no text replays as ``"content": ""``, never null;
- ``tool_choice`` (``--tool-choice``) is sent on turns that ask for nothing themselves;
- an error object in an HTTP 200 body is the provider's error, with its message;
- one key rule: the environment's key goes to the provider's own host only;
- a tool-name clash names both sources and the ways out; ``--mcp "prefix=..:CMD"`` and
  ``--without-tool``;
- ``--json`` errors are one JSON object on stdout;
- spans carry ``server.address``/``server.port``, ``gen_ai.response.model``, and a scripted
  run's finish reasons.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.semconv.attributes.server_attributes import SERVER_ADDRESS, SERVER_PORT
from typer.testing import CliRunner

import keel
from contract import case_anthropic, case_openai_chat, case_openai_responses
from contract.harness import Recorder, ordinary_request, synthesis_request
from keel.cli.app import app
from keel.errors import ConfigError, ProviderError
from keel.messages import AssistantMessage, ModelRequest, ToolCall, UserMessage
from keel.models import resolve_model
from keel.tools.executor import ToolExecutor
from keel.tools.mcp_servers import servers_from_flags
from keel.transports.anthropic import AnthropicTransport
from keel.transports.keys import PLACEHOLDER_KEY
from keel.transports.openai_chat import OpenAIChatTransport
from keel.transports.openai_responses import OpenAIResponsesTransport
from support import call

KEY = "sk-proj-ENVIRONMENT0123456789SECRET"
LOCAL = "http://127.0.0.1:8080/v1"
runner = CliRunner()


@pytest.fixture(autouse=True)
def no_ambient_provider_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_BASE_URL", "ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)


# --- wire shapes every compatible server accepts ----------------------------------------------


async def test_a_turn_with_calls_and_no_text_replays_as_empty_content_not_null() -> None:
    call_turn = AssistantMessage(None, (ToolCall.from_raw("c1", "fetch", '{"url": "x"}'),))
    server = Recorder(case_openai_chat.CASE.text_response())
    transport = OpenAIChatTransport("qwen", http_client=server.http(), base_url=LOCAL)
    await transport.request(ModelRequest("s", (), (UserMessage("q"), call_turn)))
    replayed = server.body()["messages"][2]
    assert replayed["content"] == "" and replayed["tool_calls"][0]["id"] == "c1"


@pytest.mark.parametrize(
    ("make", "case", "wire"),
    [
        (OpenAIChatTransport, case_openai_chat, "auto"),
        (OpenAIResponsesTransport, case_openai_responses, "auto"),
        (AnthropicTransport, case_anthropic, {"type": "auto"}),
    ],
)
async def test_a_configured_tool_choice_is_sent_on_turns_that_ask_for_nothing(
    make: Any, case: Any, wire: Any
) -> None:
    server = Recorder(case.CASE.text_response(), case.CASE.text_response())
    transport = make("m", http_client=server.http(), base_url=LOCAL, tool_choice="auto")
    await transport.request(ordinary_request())
    await transport.request(synthesis_request())
    assert server.body(0)["tool_choice"] == wire
    assert server.body(1)["tool_choice"] in ("none", {"type": "none"})  # synthesis stays none


def test_tool_choice_is_refused_where_no_tools_are_sent() -> None:
    with pytest.raises(ConfigError, match="XML fallback sends no tools"):
        resolve_model("xml:openai-chat:qwen", base_url=LOCAL, tool_choice="auto")


# --- an error object in a 200 body ------------------------------------------------------------

LITELLM_ANTHROPIC_ERROR = {
    "type": "error",
    "error": {"type": "api_error", "message": "litellm.APIConnectionError: upstream refused"},
}
OPENAI_STYLE_ERROR = {
    "error": {"message": "litellm.BadRequestError: no such model", "type": None, "code": "400"}
}


async def test_an_anthropic_error_object_with_http_200_is_the_providers_error() -> None:
    server = Recorder(httpx.Response(200, json=LITELLM_ANTHROPIC_ERROR))
    transport = AnthropicTransport("m", http_client=server.http(), base_url=LOCAL)
    with pytest.raises(ProviderError) as info:
        await transport.request(ordinary_request())
    assert "upstream refused" in info.value.message and "api_error" in info.value.message
    assert info.value.retryable  # an api_error is the server's failure, not the request's


@pytest.mark.parametrize("make", [OpenAIChatTransport, OpenAIResponsesTransport])
async def test_an_openai_error_object_with_http_200_is_the_providers_error(make: Any) -> None:
    server = Recorder(httpx.Response(200, json=OPENAI_STYLE_ERROR))
    transport = make("m", http_client=server.http(), base_url=LOCAL)
    with pytest.raises(ProviderError) as info:
        await transport.request(ordinary_request())
    assert "no such model" in info.value.message
    assert info.value.status == 400 and not info.value.retryable


# --- one key rule -----------------------------------------------------------------------------


async def test_the_environments_openai_key_never_goes_to_a_user_chosen_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    server = Recorder(case_openai_chat.CASE.text_response())
    await OpenAIChatTransport("m", http_client=server.http(), base_url=LOCAL).request(
        ordinary_request()
    )
    assert server.sent[0].headers["authorization"] == f"Bearer {PLACEHOLDER_KEY}"
    monkeypatch.setenv("OPENAI_BASE_URL", "https://proxy.example/v1")  # the environment's too
    proxied = Recorder(case_openai_chat.CASE.text_response())
    await OpenAIChatTransport("m", http_client=proxied.http()).request(ordinary_request())
    assert proxied.sent[0].headers["authorization"] == f"Bearer {PLACEHOLDER_KEY}"


async def test_anthropic_at_a_user_chosen_server_needs_no_key_and_gets_none_of_the_environments(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = Recorder(case_anthropic.CASE.text_response(), case_anthropic.CASE.text_response())
    without_any = AnthropicTransport("m", http_client=server.http(), base_url=LOCAL)
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    with_env_key = AnthropicTransport("m", http_client=server.http(), base_url=LOCAL)
    for transport in (without_any, with_env_key):
        await transport.request(ordinary_request())
    sent = [r.headers.get("x-api-key") or r.headers["authorization"] for r in server.sent]
    assert [key.removeprefix("Bearer ") for key in sent] == [PLACEHOLDER_KEY] * 2


async def test_a_key_the_user_gives_goes_where_the_user_said() -> None:
    server = Recorder(case_openai_chat.CASE.text_response())
    transport = OpenAIChatTransport("m", http_client=server.http(), base_url=LOCAL, api_key=KEY)
    await transport.request(ordinary_request())
    assert server.sent[0].headers["authorization"] == f"Bearer {KEY}"


def test_api_key_env_names_the_variable_and_is_saved_without_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = tmp_path / "runs.sqlite"
    monkeypatch.delenv("PROXY_KEY", raising=False)
    args = ["run", "q", "--model", "openai-chat:m", "--base-url", LOCAL, "--store", str(store)]
    code, _, err = invoke(*args, "--api-key-env", "PROXY_KEY")
    assert code == 2 and "PROXY_KEY" in err and "not set" in err


# --- MCP names --------------------------------------------------------------------------------


def test_a_tool_name_clash_names_both_sources_and_the_ways_out() -> None:
    builtin = keel.web_tools()[0]
    mcp = keel.Tool(
        name=builtin.name,
        description="Fetches a URL.",
        args_model=builtin.args_model,
        fn=builtin.fn,
        source="MCP server 'python -m mcp_server_fetch'",
    )
    marked = keel.Tool(**{**_fields(builtin), "source": "Keel's built-in tools"})
    with pytest.raises(ConfigError) as info:
        ToolExecutor([marked, mcp])
    message = str(info.value)
    assert "Keel's built-in tools" in message and "mcp_server_fetch" in message
    assert "prefix=" in message and "--without-tool fetch" in message


def test_a_clash_of_two_tools_given_in_code_gives_no_mcp_advice() -> None:
    """Issue 45: two functions of one's own with one name were told to give "the MCP server" a
    prefix and to use `keel run --without-tool`, with no MCP server and no command line."""

    @keel.tool(effect="read_only")
    def lookup(term: str) -> str:
        """Look a term up."""
        return term

    other = keel.Tool(**{**_fields(lookup), "description": "Another lookup."})
    with pytest.raises(ConfigError) as info:
        ToolExecutor([lookup, other])
    message = str(info.value)
    assert "two tools are named 'lookup'" in message
    assert "MCP" not in message and "--without-tool" not in message
    assert 'name="' in message  # how to rename one


def test_mcp_flags_take_a_prefix() -> None:
    stdio, http = servers_from_flags(
        ["prefix=web_:python -m mcp_server_fetch"], ["prefix=t_:http://127.0.0.1:9/mcp"]
    )
    assert (stdio.prefix, stdio.command) == ("web_", ("python", "-m", "mcp_server_fetch"))
    assert (http.prefix, http.url) == ("t_", "http://127.0.0.1:9/mcp")
    assert servers_from_flags(["python server.py"], [])[0].prefix == ""
    with pytest.raises(ConfigError, match="prefix=NAME:COMMAND"):
        servers_from_flags(["prefix=a b:cmd"], [])


def test_without_tool_leaves_a_built_in_tool_out_and_refuses_unknown_names(
    tmp_path: Path,
) -> None:
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"turns": [{"text": "done"}]}))
    store = ["--store", str(tmp_path / "runs.sqlite"), "--json"]
    spec = f"script:{script}"
    code, out, _ = invoke("run", "q", "--model", spec, "--without-tool", "fetch", *store)
    assert code == 0, out
    run_id = json.loads(out)["run_id"]
    db = keel.Store(tmp_path / "runs.sqlite")
    record = db.get_run(run_id)
    db.close()
    assert record is not None
    assert "fetch" not in record.config.tools and "read_file" in record.config.tools
    code, out, err = invoke("run", "q", "--model", spec, "--without-tool", "nope", *store)
    assert code == 2 and "no such built-in tool" in err


# --- --json errors ----------------------------------------------------------------------------


def test_a_json_error_is_one_json_object_on_stdout_and_a_line_on_stderr(tmp_path: Path) -> None:
    store = str(tmp_path / "runs.sqlite")
    code, out, err = invoke("run", "q", "--model", "nonsense", "--store", store, "--json")
    assert code == 2 and err.startswith("keel: unknown model spec")
    error = json.loads(out)["error"]
    assert error["kind"] == "ConfigError" and error["message"] == err.strip().removeprefix("keel: ")
    code, out, err = invoke("show", "run_missing", "--store", store, "--json")
    assert code == 2 and json.loads(out)["error"]["kind"] in ("ConfigError", "UsageError")
    code, out, _ = invoke("show", "run_missing", "--store", store)
    assert code == 2 and out == ""  # without --json, stdout stays empty


# --- traces -----------------------------------------------------------------------------------


async def test_chat_spans_carry_the_server_and_the_response_model(
    spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    answer = case_openai_chat.CASE.text_response()
    body = json.loads(answer.content) | {"model": "qwen2.5-coder-0.5b-instruct-q4_k_m"}
    server = Recorder(httpx.Response(200, json=body))
    transport = OpenAIChatTransport("qwen", http_client=server.http(), base_url=LOCAL)
    agent = keel.Agent(transport, store=tmp_path / "runs.sqlite")
    assert (await agent.arun("q")).status == "completed"
    (chat,) = [s for s in spans.get_finished_spans() if s.name.startswith("chat")]
    attributes = dict(chat.attributes or {})
    assert (attributes[SERVER_ADDRESS], attributes[SERVER_PORT]) == ("127.0.0.1", 8080)
    assert attributes[gen_ai.GEN_AI_RESPONSE_MODEL] == "qwen2.5-coder-0.5b-instruct-q4_k_m"


async def test_a_scripted_runs_chat_spans_carry_finish_reasons(
    spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    turns = [call("read_file", path="a"), {"text": "ok"}]
    script = keel.ScriptedTransport.from_dict({"turns": turns})
    agent = keel.Agent(script, tools=keel.file_tools(tmp_path), store=tmp_path / "runs.sqlite")
    assert (await agent.arun("q")).status == "completed"
    chats = sorted(
        (s for s in spans.get_finished_spans() if s.name.startswith("chat")),
        key=lambda s: s.start_time or 0,
    )
    reasons = [tuple((s.attributes or {})[gen_ai.GEN_AI_RESPONSE_FINISH_REASONS]) for s in chats]
    assert reasons == [("tool_calls",), ("stop",)]


# --- helpers ----------------------------------------------------------------------------------


def invoke(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def _fields(tool: keel.Tool) -> dict[str, Any]:
    return {name: getattr(tool, name) for name in tool.__dataclass_fields__}
