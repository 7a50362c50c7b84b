"""`keel serve` over A2A, driven by the official `a2a-sdk` Python client against a real
`keel serve` process on loopback (scripted models), ADR 0040: questions, approvals, the token."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from a2a.client import A2ACardResolver, ClientConfig, create_client
from a2a.helpers.proto_helpers import get_data_parts, new_data_part
from a2a.types import (
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    TaskState,
)
from a2a.utils.errors import (
    InvalidParamsError,
    UnsupportedOperationError,
)

from a2a_serving import (
    ANSWER,
    SRC,
    WRITE,
    Served,
    a2a,
    collect,
    decisions,
    final_state,
    keel_serve,
    paused,
    question,
    runs_in,
    task_id_of,
)


@pytest.fixture(scope="module")
def answer_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One server for the tests whose runs just answer (each run reads the script anew)."""
    tmp = tmp_path_factory.mktemp("answer")
    with keel_serve(tmp, ANSWER) as (url, _):
        yield Served(url, tmp)


@pytest.fixture(scope="module")
def write_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One server whose runs ask to write repo/out.txt (appending), with --allow-writes."""
    tmp = tmp_path_factory.mktemp("write")
    with keel_serve(tmp, WRITE, "--allow-writes") as (url, _):
        yield Served(url, tmp)


# -- a question, streamed ----------------------------------------------------------------------


async def test_a_question_streams_to_completed_and_the_answer_artifact_is_read(
    answer_server: Served,
) -> None:
    url = answer_server.url
    async with httpx.AsyncClient() as http:
        card = await A2ACardResolver(http, url).get_agent_card()
    assert card.supported_interfaces[0].url == url + "/a2a/jsonrpc"
    assert card.capabilities.streaming and not card.capabilities.push_notifications
    async with a2a(url) as client:
        events = await collect(client.send_message(question("What does the loop import?")))
        task = await client.get_task(GetTaskRequest(id=task_id_of(events)))
    assert events[0].HasField("task")
    assert final_state(events) == TaskState.TASK_STATE_COMPLETED
    artifacts = [e.artifact_update.artifact for e in events if e.HasField("artifact_update")]
    assert [a.parts[0].text for a in artifacts] == ["The loop imports the breaker."]
    assert task.status.state == TaskState.TASK_STATE_COMPLETED
    assert task.artifacts[0].name == "answer"
    assert task.artifacts[0].parts[0].text == "The loop imports the breaker."
    assert task.history[0].parts[0].text == "What does the loop import?"
    assert task.context_id == task.id  # a run that begins its conversation names it


async def test_a_non_streaming_send_waits_for_the_answer(answer_server: Served) -> None:
    http = httpx.AsyncClient(timeout=30)
    config = ClientConfig(httpx_client=http, streaming=False)
    client = await create_client(answer_server.url, client_config=config)
    try:
        [response] = await collect(client.send_message(question("Blocking?")))
    finally:
        await client.close()
        await http.aclose()
    assert response.task.status.state == TaskState.TASK_STATE_COMPLETED
    assert response.task.artifacts[0].parts[0].text == "The loop imports the breaker."


async def test_a_structured_answer_is_a_data_part_of_the_artifact(tmp_path: Path) -> None:
    schema = tmp_path / "schema.json"
    schema.write_text(
        json.dumps({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})
    )
    script = {"turns": [{"text": '{"n": 7}'}]}
    with keel_serve(tmp_path, script, "--output-schema", str(schema)) as (url, _):
        async with a2a(url) as client:
            events = await collect(client.send_message(question("How many?")))
            task = await client.get_task(GetTaskRequest(id=task_id_of(events)))
    assert task.status.state == TaskState.TASK_STATE_COMPLETED
    assert get_data_parts(task.artifacts[0].parts) == [{"n": 7}]


async def test_a_context_id_asks_a_follow_up_in_the_same_conversation(
    answer_server: Served,
) -> None:
    async with a2a(answer_server.url, binding="HTTP+JSON") as client:  # the REST binding
        first = await collect(client.send_message(question("First?")))
        context = first[0].task.context_id
        second = await collect(client.send_message(question("And then?", context_id=context)))
        listed = await client.list_tasks(ListTasksRequest(context_id=context))
    assert final_state(second) == TaskState.TASK_STATE_COMPLETED
    assert second[0].task.context_id == context != second[0].task.id
    assert {t.id for t in listed.tasks} == {first[0].task.id, second[0].task.id}


async def test_a_message_to_a_finished_task_is_refused(answer_server: Served) -> None:
    async with a2a(answer_server.url) as client:
        events = await collect(client.send_message(question("Once?")))
        before = len(runs_in(answer_server.store))
        reply = question("Again?", task_id=task_id_of(events))
        with pytest.raises(UnsupportedOperationError, match="terminal state"):
            await collect(client.send_message(reply))
    assert len(runs_in(answer_server.store)) == before


async def test_list_tasks_pages_newest_first_and_filters_by_state(answer_server: Served) -> None:
    async with a2a(answer_server.url) as client:
        for n in range(3):
            await collect(client.send_message(question(f"Listed {n}?")))
        first = await client.list_tasks(ListTasksRequest(page_size=2))
        rest = await client.list_tasks(
            ListTasksRequest(page_size=2, page_token=first.next_page_token)
        )
        done = await client.list_tasks(
            ListTasksRequest(status=TaskState.TASK_STATE_COMPLETED, page_size=100)
        )
        paused = await client.list_tasks(
            ListTasksRequest(status=TaskState.TASK_STATE_INPUT_REQUIRED)
        )
    ids = [r.run_id for r in runs_in(answer_server.store)]  # newest first
    assert [t.id for t in first.tasks] == ids[:2]
    assert first.total_size == len(ids) and first.next_page_token
    assert [t.id for t in rest.tasks] == ids[2:4]
    assert {t.id for t in done.tasks} == set(ids) and paused.tasks == []


# -- approvals ---------------------------------------------------------------------------------


async def test_a_paused_task_is_input_required_and_approving_it_runs_the_write_once(
    write_server: Served,
) -> None:
    written = write_server.tmp / "repo" / "out.txt"
    async with a2a(write_server.url) as client:
        task_id, call = await paused(client)
        assert call["name"] == "write_file"
        assert [a["name"] for a in call["arguments"]] == ["path", "append", "content"]
        assert not written.exists()
        approve = {"call_id": call["call_id"], "approve": True}
        after = await collect(client.send_message(decisions(task_id, approve)))
        task = await client.get_task(GetTaskRequest(id=task_id))
    assert final_state(after) == TaskState.TASK_STATE_COMPLETED
    assert task.artifacts[0].parts[0].text == "Wrote out.txt."
    assert written.read_text() == "hello\n"  # appended once, not twice


async def test_a_denial_is_recorded_and_the_run_goes_on_without_the_write(
    write_server: Served,
) -> None:
    async with a2a(write_server.url) as client:
        task_id, call = await paused(client)
        bad = decisions(task_id, {"call_id": "k9_9", "approve": True})
        with pytest.raises(InvalidParamsError, match="k9_9"):
            await collect(client.send_message(bad))
        with pytest.raises(InvalidParamsError, match="keel_decisions"):
            await collect(client.send_message(question("perhaps", task_id=task_id)))
        shapeless = question("", task_id=task_id)
        shapeless.message.parts[0].CopyFrom(new_data_part({"keel_decisions": "yes"}))
        with pytest.raises(InvalidParamsError, match="must be a list"):
            await collect(client.send_message(shapeless))
        deny = {"call_id": call["call_id"], "approve": False, "reason": "not there"}
        after = await collect(client.send_message(decisions(task_id, deny)))
    assert final_state(after) == TaskState.TASK_STATE_COMPLETED
    [run] = [r for r in runs_in(write_server.store) if r.run_id == task_id]
    assert run.state.decisions[call["call_id"]].reason == "not there"


async def test_a_decision_on_another_agents_run_is_refused_before_it_is_recorded(
    write_server: Served, tmp_path: Path
) -> None:
    async with a2a(write_server.url) as client:
        task_id, call = await paused(client)
    with keel_serve(tmp_path, ANSWER, name="other", store=write_server.store) as (url, _):
        async with a2a(url) as client:
            approve = decisions(task_id, {"call_id": call["call_id"], "approve": True})
            with pytest.raises(InvalidParamsError, match="cannot go on here"):
                await collect(client.send_message(approve))
    [run] = [r for r in runs_in(write_server.store) if r.run_id == task_id]
    assert run.status == "awaiting_approval" and run.state.decisions == {}


async def test_cancelling_a_paused_task_ends_it_cancelled(write_server: Served) -> None:
    async with a2a(write_server.url) as client:
        task_id, _ = await paused(client)
        task = await client.cancel_task(CancelTaskRequest(id=task_id))
    assert task.status.state == TaskState.TASK_STATE_CANCELED
    [run] = [r for r in runs_in(write_server.store) if r.run_id == task_id]
    assert run.status == "cancelled"


async def test_without_a_token_a_request_under_another_host_name_is_refused(
    answer_server: Served,
) -> None:
    """DNS rebinding: a page elsewhere reaches the loopback server under its own name."""
    before = len(runs_in(answer_server.store))
    body = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
            "params": {"message": {"messageId": "m1", "role": "ROLE_USER",
                                   "parts": [{"text": "Rebound?"}]}}}  # fmt: skip
    async with httpx.AsyncClient() as http:
        refused = await http.post(
            answer_server.url + "/a2a/jsonrpc", json=body, headers={"Host": "evil.example"}
        )
    assert refused.status_code == 403
    assert len(runs_in(answer_server.store)) == before


# -- the token ---------------------------------------------------------------------------------


def test_beyond_loopback_keel_serve_refuses_to_start_without_a_token(tmp_path: Path) -> None:
    (tmp_path / "s.json").write_text(json.dumps(ANSWER))
    env = {**os.environ, "PYTHONPATH": SRC, "HOME": str(tmp_path)}
    env.pop("KEEL_SERVE_TOKEN", None)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "keel",
            "serve",
            "--host",
            "0.0.0.0",
            "--port",
            "0",
            "--model",
            f"script:{tmp_path / 's.json'}",
            "--store",
            str(tmp_path / "runs.db"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2
    assert "give a token (--token or KEEL_SERVE_TOKEN)" in done.stderr


AG_UI_RUN = {
    "threadId": "t1",
    "runId": "r1",
    "state": None,
    "messages": [{"id": "m1", "role": "user", "content": "Sneak in?"}],
    "tools": [],
    "context": [],
    "forwardedProps": None,
}


async def test_keel_serve_answers_ag_ui_beside_a2a(tmp_path: Path) -> None:
    with keel_serve(tmp_path, ANSWER, "--token", "s3cret") as (url, _):
        async with httpx.AsyncClient(timeout=30) as http:
            reply = await http.post(
                url + "/ag-ui",
                json=AG_UI_RUN,
                headers={"Authorization": "Bearer s3cret", "Accept": "text/event-stream"},
            )
    assert reply.status_code == 200
    types = [
        json.loads(line[len("data: ") :])["type"]
        for line in reply.text.splitlines()
        if line.startswith("data: ")
    ]
    assert types[0] == "RUN_STARTED" and types[-1] == "RUN_FINISHED"
    assert [run.status for run in runs_in(tmp_path / "runs.db")] == ["completed"]


async def test_a_request_without_the_token_gets_401_and_records_nothing(tmp_path: Path) -> None:
    with keel_serve(tmp_path, ANSWER, "--token", "s3cret") as (url, _):
        body = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "SendMessage",
            "params": {
                "message": {
                    "messageId": "m1",
                    "role": "ROLE_USER",
                    "parts": [{"text": "Sneak in?"}],
                }
            },
        }
        async with httpx.AsyncClient() as http:
            bare = await http.post(url + "/a2a/jsonrpc", json=body)
            wrong = await http.post(
                url + "/a2a/jsonrpc", json=body, headers={"Authorization": "Bearer nope"}
            )
            rest = await http.post(url + "/a2a/rest/message:send", json=body["params"])
            ag_ui = await http.post(url + "/ag-ui", json=AG_UI_RUN)
            card = (await http.get(url + "/.well-known/agent-card.json")).json()
        assert [bare.status_code, wrong.status_code, rest.status_code] == [401, 401, 401]
        assert ag_ui.status_code == 401  # the AG-UI route is behind the same token
        assert bare.headers["www-authenticate"].startswith("Bearer")
        assert "bearer" in card["securitySchemes"]
        assert runs_in(tmp_path / "runs.db") == []
        async with httpx.AsyncClient() as http:  # with the token, any name for the host does
            renamed = await http.post(
                url + "/a2a/jsonrpc",
                json={**body, "method": "GetTask", "params": {"id": "run_none"}},
                headers={
                    "Authorization": "Bearer s3cret",
                    "Host": "keel.internal",
                    "A2A-Version": "1.0",
                },
            )
        assert renamed.status_code == 200 and "run_none" in renamed.text
        async with a2a(url, token="s3cret") as client:
            events = await collect(client.send_message(question("With the token?")))
    assert final_state(events) == TaskState.TASK_STATE_COMPLETED
