"""A chat server that writes a tool call as text (a chat template's pseudo-call) never has it
stored as the answer: `functions.NAME:` then JSON (llama-cpp-python's chatml-function-calling,
HTML-escaped when it replays a call), ``<tool_call>`` blocks and the bare JSON of a known tool
(a model's own template, which that server does not parse) are read as the call; one that
cannot be read (an unknown tool, broken JSON, an unclosed ``["NAME", {...}`` array) is a
classified ModelError naming the chat format and what to use instead. In a synthesis turn,
where no call can be made, a pseudo-call (or Keel's own control repeated back) is neither the
answer nor a failure (PC-02, ADR 0065): the turn is asked again with a stricter control, and
the run ends with an answer built from its record when that fails too. Real SDK, canned
answers (the real server: `test_compat_servers.py`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

import keel
from contract.harness import Recorder
from keel.errors import ProviderError
from keel.messages import ModelRequest, ToolDefinition, UserMessage
from keel.transports.openai_chat import OpenAIChatTransport

READ = ToolDefinition(
    "read_file", "Read a file.", {"type": "object", "properties": {"path": {"type": "string"}}}
)


def said(text: str) -> httpx.Response:
    message = {"role": "assistant", "content": text}
    choice = {"index": 0, "message": message, "finish_reason": "stop"}
    body = {"id": "c", "object": "chat.completion", "model": "m", "choices": [choice]}
    return httpx.Response(200, json=body)


def transport(*answers: str) -> tuple[OpenAIChatTransport, Recorder]:
    server = Recorder(*(said(a) for a in answers))
    chat = OpenAIChatTransport(
        "qwen", http_client=server.http(), base_url="http://127.0.0.1:8080/v1"
    )
    return chat, server


def asked(tool_choice: Any = None, tools: tuple[ToolDefinition, ...] = (READ,)) -> ModelRequest:
    return ModelRequest("Be careful.", tools, (UserMessage("q"),), tool_choice, ())


@pytest.mark.parametrize(
    "text",
    [
        'functions.read_file:\n{"path": "notes.md"}',
        "functions.read_file:\n{&#34;path&#34;: &#34;notes.md&#34;}",
        '<tool_call>\n{"name": "read_file", "arguments": {"path": "notes.md"}}\n</tool_call>',
        '{"name": "read_file", "arguments": "{\\"path\\": \\"notes.md\\"}"}',
        "{&#34;name&#34;: &#34;read_file&#34;, "
        "&#34;arguments&#34;: {&#34;path&#34;: &#34;notes.md&#34;}}",
        '["read_file", {"path": "notes.md"}]',
    ],
    ids=["functions", "functions-escaped", "tool_call", "bare-json", "bare-json-escaped", "array"],
)
async def test_a_pseudo_call_of_a_known_tool_is_read_as_that_call(text: str) -> None:
    chat, _ = transport(text)
    response = await chat.request(asked())
    assert response.text is None
    ((one),) = response.tool_calls
    assert (one.name, json.loads(one.raw_arguments)) == ("read_file", {"path": "notes.md"})


async def test_several_functions_pseudo_calls_are_several_calls() -> None:
    chat, _ = transport('functions.read_file:\n{"path": "a"}\nfunctions.read_file:\n{"path": "b"}')
    response = await chat.request(asked())
    assert [json.loads(c.raw_arguments)["path"] for c in response.tool_calls] == ["a", "b"]
    assert len({c.id for c in response.tool_calls}) == 2


@pytest.mark.parametrize(
    ("text", "choice", "named"),
    [
        ('functions.delete_all:\n{"path": "/"}', None, "chatml-function-calling"),
        ("functions.read_file:\n{&#34;path&#34;: ", None, "chatml-function-calling"),
        ('<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>', None, "<tool_call>"),
        ('["read_file", {"path": "notes.md"}', None, "JSON array"),
        ('["read_file", {"path": "notes.md"}, 3]', None, "JSON array"),
    ],
    ids=["unknown-tool", "broken-json", "tool_call-unknown", "array-unclosed", "array-long"],
)
async def test_a_pseudo_call_that_cannot_be_read_is_refused_naming_the_chat_format(
    text: str, choice: Any, named: str
) -> None:
    chat, _ = transport(text)
    with pytest.raises(ProviderError) as refused:
        await chat.request(asked(choice))
    assert not refused.value.retryable
    assert named in refused.value.message and "xml:openai-chat:" in refused.value.message


@pytest.mark.parametrize(
    ("text", "tools"),
    [
        ("The port is 8421; functions.read_file: is how it was found.", (READ,)),
        ('{"name": "widget", "port": 8421}', (READ,)),
        ('functions.read_file:\n{"path": "notes.md"}', ()),  # no tools: the XML fallback reads it
        ('["read_file", "list_files"]', (READ,)),  # names, not a call
    ],
)
async def test_an_ordinary_answer_is_left_as_it_is(
    text: str, tools: tuple[ToolDefinition, ...]
) -> None:
    chat, _ = transport(text)
    response = await chat.request(asked(tools=tools))
    assert response.text == text and not response.tool_calls


def test_a_run_whose_model_writes_calls_as_text_never_stores_one_as_the_answer(
    tmp_path: Path,
) -> None:
    (tmp_path / "notes.md").write_text("The widget listens on port 8421.\n")
    chat, _ = transport(
        "functions.read_file:\n{&#34;path&#34;: &#34;notes.md&#34;}",
        "The widget listens on port 8421.",
    )
    with keel.Agent(chat, tools=keel.file_tools(tmp_path), store=tmp_path / "r.db") as agent:
        done = agent.run("Which port?")
    assert done.status == "completed", done.failure
    assert done.answer == "The widget listens on port 8421." and done.tool_calls == 1
    chat, _ = transport('["read_file", {"path": "notes.md"}')  # unclosed, in a normal turn
    with keel.Agent(chat, tools=keel.file_tools(tmp_path), store=tmp_path / "s.db") as agent:
        failed = agent.run("Which port?")
    assert failed.status == "failed" and failed.answer is None
    assert failed.failure is not None and failed.failure.kind == "ModelError"
    assert "JSON array" in failed.failure.message


@pytest.mark.parametrize(
    "pseudo",
    [
        'functions.read_file:\n{"path": "notes.md"}',
        '["read_file", {"path": "notes.md"}',
        '<tool_call>\n{"name": "read_file", "arguments": {"path": "notes.md"}}\n</tool_call>',
    ],
    ids=["functions", "array-unclosed", "tool_call"],
)
def test_pc02_a_pseudo_call_in_a_synthesis_turn_is_neither_the_answer_nor_a_failure(
    tmp_path: Path, pseudo: str
) -> None:
    """The only model call the budget allows is a synthesis turn; the model writes a call in
    it. The run completes, synthesized, with an answer built from its record that says the
    call could not be made; the call's text is not the answer."""
    chat, server = transport(pseudo)
    limits = keel.Limits(max_model_calls=1)
    with keel.Agent(
        chat, tools=keel.file_tools(tmp_path), store=tmp_path / "s.db", limits=limits
    ) as agent:
        done = agent.run("Which port?")
    assert done.status == "completed", done.failure
    assert done.answer is not None and done.answer.startswith("No answer was written.")
    assert "read_file" in done.answer and "could not be made" in done.answer
    assert pseudo not in done.answer and "notes.md" not in done.answer
    assert done.synthesized == "budget"
    assert len(server.sent) == 1  # no model call past the budget


def test_pc02_a_synthesis_turn_that_writes_a_call_is_asked_again_stricter(
    tmp_path: Path,
) -> None:
    """With a model call left, the synthesis turn is asked once more with a stricter
    control, and the answer it then writes is the run's."""
    from keel._run.unanswered import STRICTER_CONTROL

    (tmp_path / "notes.md").write_text("The widget listens on port 8421.\n")
    chat, server = transport(
        'functions.read_file:\n{"path": "notes.md"}',
        'functions.read_file:\n{"path": "notes.md"}',
        "The widget listens on port 8421 [r1].",
    )
    limits = keel.Limits(max_tool_calls=1)  # after one call, only an answer
    with keel.Agent(
        chat, tools=keel.file_tools(tmp_path), store=tmp_path / "s.db", limits=limits
    ) as agent:
        done = agent.run("Which port?")
    assert done.status == "completed", done.failure
    assert done.answer == "The widget listens on port 8421 [r1]."
    assert done.synthesized == "budget" and done.tool_calls == 1
    sent = [json.dumps(server.body(i)) for i in range(len(server.sent))]
    assert len(sent) == 3 and STRICTER_CONTROL not in sent[1] and STRICTER_CONTROL in sent[2]


def test_pc02_a_synthesis_reply_that_repeats_keels_control_is_not_the_answer(
    tmp_path: Path,
) -> None:
    """The chatml-function-calling template's synthesis turn parroted the citation
    instruction: twice, then the run answers from its record, naming its results."""
    from keel._run.synthesis import BUDGET_CONTROL

    (tmp_path / "notes.md").write_text("The widget listens on port 8421.\n")
    call = 'functions.read_file:\n{"path": "notes.md"}'
    chat, _ = transport(call, BUDGET_CONTROL, BUDGET_CONTROL)
    limits = keel.Limits(max_tool_calls=1)
    with keel.Agent(
        chat, tools=keel.file_tools(tmp_path), store=tmp_path / "s.db", limits=limits
    ) as agent:
        done = agent.run("Which port?")
    assert done.status == "completed", done.failure
    assert done.answer is not None and done.answer.startswith("No answer was written.")
    assert "repeated Keel's instructions" in done.answer and "[r1] read_file" in done.answer
    assert "citing each result" not in done.answer


def test_pc02_a_deadline_synthesis_that_writes_a_call_is_not_asked_again(tmp_path: Path) -> None:
    """The deadline's synthesis turn had time for one reply: a pseudo-call there (from any
    model, a scripted one here) ends the run with the built answer at once, no second try."""
    from keel.records import ModelRequestSent

    (tmp_path / "notes.md").write_text("The widget listens on port 8421.\n")
    read = {"tool_calls": [{"name": "read_file", "arguments": {"path": "notes.md"}}]}
    pseudo = {"text": 'functions.read_file:\n{"path": "notes.md"}'}
    script = {"turns": [read] * 6, "on_synthesis": pseudo, "latency_ms": 300}
    with keel.Agent(
        keel.ScriptedTransport.from_dict(script),
        tools=keel.file_tools(tmp_path),
        store=tmp_path / "d.db",
        limits=keel.Limits(deadline=2.0),
    ) as agent:
        done = agent.run("Which port?")
        sent = [e.synthesis for e in agent.store.events(done.run_id)
                if isinstance(e, ModelRequestSent)]  # fmt: skip
    assert done.status == "completed" and done.synthesized == "deadline", done.failure
    assert done.answer is not None and done.answer.startswith("No answer was written.")
    assert sent.count("deadline") == 1
