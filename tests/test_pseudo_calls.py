"""A chat server that writes a tool call as text (a chat template's pseudo-call) never has it
stored as the answer: `functions.NAME:` then JSON (llama-cpp-python's chatml-function-calling,
HTML-escaped when it replays a call), ``<tool_call>`` blocks and the bare JSON of a known tool
(a model's own template, which that server does not parse) are read as the call; one that
cannot be read (an unknown tool, broken JSON), or any in a turn that allows no calls, is a
classified ModelError naming the chat format and what to use instead. Real SDK, canned
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
    ],
    ids=["functions", "functions-escaped", "tool_call", "bare-json", "bare-json-escaped"],
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
        ('functions.read_file:\n{"path": "notes.md"}', "none", "chatml-function-calling"),
        ('<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>', None, "<tool_call>"),
        ('{"name": "read_file", "arguments": {"path": "x"}}', "none", "chat template"),
    ],
    ids=["unknown-tool", "broken-json", "in-synthesis", "tool_call-unknown", "bare-in-synthesis"],
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
    chat, _ = transport(*['functions.read_file:\n{"path": "notes.md"}'] * 2)
    limits = keel.Limits(max_model_calls=1)
    with keel.Agent(
        chat, tools=keel.file_tools(tmp_path), store=tmp_path / "s.db", limits=limits
    ) as agent:
        failed = agent.run("Which port?")
    assert failed.status == "failed" and failed.answer is None
    assert failed.failure is not None and failed.failure.kind == "ModelError"
    assert "chatml-function-calling" in failed.failure.message
