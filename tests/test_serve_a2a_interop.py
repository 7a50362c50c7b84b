"""`keel serve` for A2A clients other than the official 1.0 one (issue 37), against a real
`keel serve` on loopback: spec 1.0 and 0.3 side by side (the a2a-sdk's compat layer), a request
without the `A2A-Version` header answered as 0.3 (fasta2a's `message/send` got "method not
found"), a card a strict 0.3 reader accepts (skills with `inputModes`/`outputModes`, which
fasta2a requires), and a paused task decided by the text an ordinary client sends (`approve`,
`deny: reason`, `yes`/`no`) when one call is pending, or by Google ADK's function response to
the call it made of the pause, in both shapes ADK sends it (a data part marked
`adk_type: function_response`, and ADK 2's JSON text). The 0.3 requests are written by hand and
the card read by the SDK's own 0.3 model; fasta2a and ADK themselves run against a real server
in tests/test_serve_a2a_fasta2a.py and tests/test_serve_a2a_adk.py."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from a2a.compat.v0_3 import types as v03
from a2a.helpers.proto_helpers import new_data_part
from a2a.types import GetTaskRequest, Message, Role, SendMessageRequest, TaskState
from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH
from a2a.utils.errors import InvalidParamsError

from a2a_serving import (
    ANSWER,
    WRITE,
    Served,
    a2a,
    collect,
    final_state,
    keel_serve,
    paused,
    question,
    runs_in,
)


@pytest.fixture(scope="module")
def answer_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("answer")
    with keel_serve(tmp, ANSWER) as (url, _):
        yield Served(url, tmp)


@pytest.fixture(scope="module")
def write_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("write")
    with keel_serve(tmp, WRITE, "--allow-writes") as (url, _):
        yield Served(url, tmp)


def v03_message(text: str) -> dict[str, Any]:
    parts = [{"kind": "text", "text": text}]
    return {"kind": "message", "messageId": uuid.uuid4().hex, "role": "user", "parts": parts}


def test_the_card_is_valid_for_a_strict_0_3_reader_and_names_both_versions(
    answer_server: Served,
) -> None:
    card = httpx.get(answer_server.url + AGENT_CARD_WELL_KNOWN_PATH, timeout=10).json()
    strict = v03.AgentCard.model_validate(card)  # what a 0.3 client reads
    assert strict.protocol_version == "0.3" and strict.url.endswith("/a2a/jsonrpc")
    for skill in card["skills"]:
        assert skill["inputModes"] and skill["outputModes"]
    versions = {(i["protocolBinding"], i["protocolVersion"]) for i in card["supportedInterfaces"]}
    assert {("JSONRPC", "1.0"), ("JSONRPC", "0.3"), ("HTTP+JSON", "0.3")} <= versions
    assert "approve" in card["description"] and "deny: " in card["description"]


def test_a_0_3_message_send_without_the_version_header_is_answered_as_0_3(
    answer_server: Served,
) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "message/send",
            "params": {"message": v03_message("What does the loop import?")}}  # fmt: skip
    said = httpx.post(answer_server.url + "/a2a/jsonrpc", json=body, timeout=30).json()
    assert "error" not in said, said
    task = v03.Task.model_validate(said["result"])
    assert task.kind == "task" and task.status.state in {"working", "completed", "submitted"}
    got = {"jsonrpc": "2.0", "id": 2, "method": "tasks/get", "params": {"id": task.id}}
    for _ in range(100):
        read = v03.Task.model_validate(
            httpx.post(answer_server.url + "/a2a/jsonrpc", json=got, timeout=30).json()["result"]
        )
        if read.status.state == "completed":
            break
    assert read.status.state == "completed"
    assert read.artifacts
    assert read.artifacts[0].parts[0].root.text == "The loop imports the breaker."  # type: ignore[union-attr]


def test_a_0_3_rest_send_without_the_version_header_is_answered(answer_server: Served) -> None:
    message = {"messageId": uuid.uuid4().hex, "role": "ROLE_USER",
               "content": [{"text": "What does the loop import?"}]}  # 0.3's proto JSON
    body = {"message": message}  # fmt: skip
    said = httpx.post(answer_server.url + "/a2a/rest/v1/message:send", json=body, timeout=30)
    assert said.status_code == 200, said.text
    assert said.json().get("task", said.json()).get("id")


@pytest.mark.parametrize(
    ("text", "approved", "reason"),
    [
        ("approve", True, ""),
        ("Yes", True, ""),
        ("deny: not that file", False, "not that file"),
        ("no", False, "denied by the A2A client"),
    ],
)
async def test_a_text_reply_decides_a_task_with_one_pending_call(
    write_server: Served, text: str, approved: bool, reason: str
) -> None:
    async with a2a(write_server.url) as client:
        task_id, call = await paused(client)
        after = await collect(client.send_message(question(text, task_id=task_id)))
        task = await client.get_task(GetTaskRequest(id=task_id))
    assert final_state(after) == TaskState.TASK_STATE_COMPLETED, task
    [run] = [r for r in runs_in(write_server.store) if r.run_id == task_id]
    decision = run.state.decisions[call["call_id"]]
    assert decision.approved is approved
    if not approved:
        assert decision.reason == reason


ADK_CALL = "mock_function_call_for_required_user_input"
"""The function call ADK's `RemoteA2aAgent` makes of a task's input-required (its
`converters/to_adk_event.py`); an ADK app resumes the task with a function response to it."""


def adk_function_response(task_id: str, response: dict[str, Any]) -> SendMessageRequest:
    """The reply ADK's `RemoteA2aAgent` sends when the app answers its call with a function
    response kept as data (ADK 1.x always; ADK 2 beside other function responses): the
    response's `model_dump(by_alias=True, exclude_none=True)` as a data part, marked
    `adk_type: function_response` (ADK's `converters/part_converter.py`)."""
    part = new_data_part({"id": uuid.uuid4().hex, "name": ADK_CALL, "response": response})
    part.metadata.update({"adk_type": "function_response"})
    message = Message(message_id=uuid.uuid4().hex, role=Role.ROLE_USER, task_id=task_id,
                      context_id=task_id, parts=[part])  # fmt: skip
    return SendMessageRequest(message=message)


@pytest.mark.parametrize(
    ("response", "approved", "reason"),
    [
        ({"result": "approve"}, True, ""),
        ({"result": "deny: not that file"}, False, "not that file"),
        ({"approved": True}, True, ""),
        ({"confirmed": False, "reason": "no writes today"}, False, "no writes today"),
    ],
)
@pytest.mark.parametrize("shape", ["data part", "json text"])
async def test_adks_function_response_decides_a_task_with_one_pending_call(
    write_server: Served, shape: str, response: dict[str, Any], approved: bool, reason: str
) -> None:
    """ADK 2 sends `{"result": TEXT}` as TEXT (covered by the text replies above) and any other
    response as its JSON text (`_render_user_function_response`); ADK 1.x sends a data part."""
    async with a2a(write_server.url) as client:
        task_id, call = await paused(client)
        if shape == "data part":
            reply = adk_function_response(task_id, response)
        else:
            reply = question(json.dumps(response), task_id=task_id)
        after = await collect(client.send_message(reply))
    assert final_state(after) == TaskState.TASK_STATE_COMPLETED
    [run] = [r for r in runs_in(write_server.store) if r.run_id == task_id]
    decision = run.state.decisions[call["call_id"]]
    assert decision.approved is approved
    if not approved:
        assert decision.reason == reason


async def test_adk_1s_function_response_in_a_0_3_message_send_decides_the_task(
    write_server: Served,
) -> None:
    """ADK 1.x speaks A2A 0.3 (a2a-sdk 0.3): its reply is a 0.3 `message/send`, no version
    header, the function response a `kind: data` part with its metadata."""
    async with a2a(write_server.url) as client:
        task_id, call = await paused(client)
    data = {"id": uuid.uuid4().hex, "name": ADK_CALL, "response": {"result": "approve"}}
    part = {"kind": "data", "data": data, "metadata": {"adk_type": "function_response"}}
    message = {"kind": "message", "messageId": uuid.uuid4().hex, "role": "user",
               "taskId": task_id, "contextId": task_id, "parts": [part]}  # fmt: skip
    body = {"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {"message": message}}
    async with httpx.AsyncClient(timeout=30) as http:
        said = (await http.post(write_server.url + "/a2a/jsonrpc", json=body)).json()
    assert "error" not in said, said
    [run] = [r for r in runs_in(write_server.store) if r.run_id == task_id]
    assert run.state.decisions[call["call_id"]].approved is True


async def test_an_adk_function_response_that_decides_nothing_is_refused_naming_what_to_send(
    write_server: Served,
) -> None:
    async with a2a(write_server.url) as client:
        task_id, _ = await paused(client)
        with pytest.raises(InvalidParamsError, match=r'approve.*"approved": true.*keel_decisions'):
            await collect(client.send_message(adk_function_response(task_id, {"result": "hm"})))


async def test_a_text_reply_that_is_no_decision_is_refused_naming_what_to_send(
    write_server: Served,
) -> None:
    async with a2a(write_server.url) as client:
        task_id, _ = await paused(client)
        with pytest.raises(InvalidParamsError, match=r"approve.*deny: REASON.*keel_decisions"):
            await collect(client.send_message(question("maybe later", task_id=task_id)))
