"""`keel serve` over A2A, driven by the official `a2a-sdk` Python client against a real
`keel serve` process on loopback (scripted models), ADR 0040."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.client import A2ACardResolver, Client, ClientConfig, create_client
from a2a.helpers.proto_helpers import get_data_parts, new_data_part
from a2a.types import (
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    StreamResponse,
    SubscribeToTaskRequest,
    TaskState,
)
from a2a.utils.errors import (
    InvalidParamsError,
    TaskNotCancelableError,
    UnsupportedOperationError,
)

from keel.store import RunRecord, Store

SRC = str(Path(__file__).resolve().parents[1] / "src")
ANSWER = {"turns": [{"text": "The loop imports the breaker."}]}
WRITE = {
    "turns": [
        {
            "tool_calls": [
                {
                    "name": "write_file",
                    "arguments": {"content": "hello\n", "path": "out.txt", "append": True},
                }
            ]
        },
        {"text": "Wrote out.txt."},
    ]
}
SLOW = {"turns": [{"text": "late"}], "latency_ms": 20_000}
STEPS = {
    "turns": [
        *(
            {"tool_calls": [{"name": "list_files", "arguments": {"path": f"d{i}"}}]}
            for i in range(4)
        ),
        {"text": "Done listing."},
    ],
    "latency_ms": 250,
}
FAILS = {"turns": [{"error": {"status": 400, "message": "the request is malformed"}}]}


Spec = tuple[dict[str, Any], tuple[str, ...]]
"""A server's script and its extra options."""


def launch(tmp: Path, spec: Spec, name: str, store: Path) -> subprocess.Popen[str]:
    script, extra = spec
    path = tmp / f"{name}.json"
    path.write_text(json.dumps(script))
    (tmp / "repo").mkdir(exist_ok=True)
    args = [
        *(sys.executable, "-m", "keel", "serve", "--port", "0", "--model", f"script:{path}"),
        *("--store", str(store), "--repo", str(tmp / "repo"), *extra),
    ]
    env = {**os.environ, "PYTHONPATH": SRC, "HOME": str(tmp)}
    env.pop("KEEL_SERVE_TOKEN", None)
    return subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def stop(processes: list[subprocess.Popen[str]]) -> None:
    """SIGTERM to each at once, then wait for each (SIGKILL after 10 s)."""
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()


@contextmanager
def keel_servers(
    tmp: Path, specs: dict[str, Spec], store: Path | str | None = None
) -> Iterator[dict[str, tuple[str, subprocess.Popen[str]]]]:
    """`keel serve`s on free loopback ports, started at once (one store); by name: the URL
    and the process of each."""
    processes = {
        name: launch(tmp, spec, name, store or tmp / "runs.db") for name, spec in specs.items()
    }
    try:
        served = {}
        for name, process in processes.items():
            assert process.stdout is not None and process.stderr is not None
            url = process.stdout.readline().strip()
            assert url.startswith("http://127.0.0.1:"), process.stderr.read()
            served[name] = (url, process)
        yield served
    finally:
        stop(list(processes.values()))


@contextmanager
def keel_serve(
    tmp: Path, script: dict[str, Any], *extra: str, name: str = "s", store: Path | None = None
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """One `keel serve` on a free loopback port; yields its URL and process."""
    with keel_servers(tmp, {name: (script, extra)}, store) as served:
        yield served[name]


@dataclass(frozen=True)
class Served:
    url: str
    tmp: Path

    @property
    def store(self) -> Path:
        return self.tmp / "runs.db"


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


@asynccontextmanager
async def a2a(
    url: str, *, token: str | None = None, binding: str = "JSONRPC"
) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    http = httpx.AsyncClient(headers=headers, timeout=30)
    config = ClientConfig(httpx_client=http, supported_protocol_bindings=[binding])
    client = await create_client(url, client_config=config)
    try:
        yield client
    finally:
        await client.close()
        await http.aclose()


def question(text: str, **fields: Any) -> SendMessageRequest:
    message = Message(
        message_id=uuid.uuid4().hex, role=Role.ROLE_USER, parts=[Part(text=text)], **fields
    )
    return SendMessageRequest(message=message)


def decisions(task_id: str, *items: dict[str, Any]) -> SendMessageRequest:
    message = Message(
        message_id=uuid.uuid4().hex,
        role=Role.ROLE_USER,
        task_id=task_id,
        parts=[new_data_part({"keel_decisions": list(items)})],
    )
    return SendMessageRequest(message=message)


async def collect(stream: AsyncIterator[StreamResponse]) -> list[StreamResponse]:
    return [event async for event in stream]


def final_state(events: list[StreamResponse]) -> int:
    last = events[-1]
    return (
        last.status_update.status.state
        if last.HasField("status_update")
        else last.task.status.state
    )


def task_id_of(events: list[StreamResponse]) -> str:
    return events[0].task.id


def seq_of(event: StreamResponse) -> int | None:
    if not event.HasField("status_update") or "keel_seq" not in event.status_update.metadata:
        return None
    return int(event.status_update.metadata["keel_seq"])


def runs_in(store: Path) -> list[RunRecord]:
    """The runs recorded, read from the store itself."""
    if not store.exists():
        return []
    db = Store(store, read_only=True)
    try:
        return db.list_runs(100)
    finally:
        db.close()


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


async def paused(client: Client) -> tuple[str, dict[str, Any]]:
    """A new task on the write server, streamed to input-required: its id and pending call."""
    events = await collect(client.send_message(question("Write it.")))
    assert final_state(events) == TaskState.TASK_STATE_INPUT_REQUIRED
    status = events[-1].status_update.status
    [pending] = [d["keel_pending"] for d in get_data_parts(status.message.parts)]
    [call] = pending
    return task_id_of(events), call


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
            await collect(client.send_message(question("yes", task_id=task_id)))
        deny = {"call_id": call["call_id"], "approve": False, "reason": "not there"}
        after = await collect(client.send_message(decisions(task_id, deny)))
    assert final_state(after) == TaskState.TASK_STATE_COMPLETED
    [run] = [r for r in runs_in(write_server.store) if r.run_id == task_id]
    assert run.state.decisions[call["call_id"]].reason == "not there"


async def test_cancelling_a_paused_task_ends_it_cancelled(write_server: Served) -> None:
    async with a2a(write_server.url) as client:
        task_id, _ = await paused(client)
        task = await client.cancel_task(CancelTaskRequest(id=task_id))
    assert task.status.state == TaskState.TASK_STATE_CANCELED
    [run] = [r for r in runs_in(write_server.store) if r.run_id == task_id]
    assert run.status == "cancelled"


# -- cancel, resubscribe, restart --------------------------------------------------------------


async def test_cancel_ends_the_run_cancelled(tmp_path: Path) -> None:
    with keel_serve(tmp_path, SLOW) as (url, _):
        async with a2a(url) as client:
            sent = client.send_message(question("Take your time."))
            first = await anext(sent)
            await sent.aclose()
            task = await asyncio.wait_for(
                client.cancel_task(CancelTaskRequest(id=first.task.id)), 10
            )
            assert task.status.state == TaskState.TASK_STATE_CANCELED
            again = await client.get_task(GetTaskRequest(id=first.task.id))
            assert again.status.state == TaskState.TASK_STATE_CANCELED
            with pytest.raises(TaskNotCancelableError, match="already ended"):
                await client.cancel_task(CancelTaskRequest(id=first.task.id))
    [run] = runs_in(tmp_path / "runs.db")
    assert run.status == "cancelled"


async def test_a_dropped_stream_resubscribed_continues_without_loss_or_repeat(
    tmp_path: Path,
) -> None:
    with keel_serve(tmp_path, STEPS) as (url, _):
        async with a2a(url) as client:
            sent = client.send_message(question("List the folders."))
            first = await anext(sent)
            seen: list[int] = [int(first.task.metadata["keel_last_seq"])]
            async for event in sent:
                if (seq := seq_of(event)) is not None:
                    seen.append(seq)
                if len(seen) >= 4:
                    break
            await sent.aclose()  # the stream drops mid-run
            resumed = await collect(client.subscribe(SubscribeToTaskRequest(id=first.task.id)))
            snapshot = resumed[0].task
            history = [int(m.metadata["keel_seq"]) for m in snapshot.history[1:]]
            later = [s for s in map(seq_of, resumed[1:]) if s is not None]
            final = await client.get_task(GetTaskRequest(id=first.task.id))
    everything = [int(m.metadata["keel_seq"]) for m in final.history[1:]]
    assert everything == list(range(len(everything)))
    assert set(seen[1:]) <= set(history)  # what the dropped stream gave is in the snapshot
    assert history + later == everything  # and after it, each event exactly once
    assert later, "the run was still going when the stream dropped"
    assert final_state(resumed) == TaskState.TASK_STATE_COMPLETED


async def test_a_killed_server_restarted_answers_get_task_for_every_task(tmp_path: Path) -> None:
    store = tmp_path / "runs.db"
    ids: dict[str, str] = {}
    specs: dict[str, Spec] = {
        "completed": (ANSWER, ()),
        "failed": (FAILS, ()),
        "input_required": (WRITE, ("--allow-writes",)),
    }
    with keel_servers(tmp_path, specs, store) as served:  # three servers, one store
        for name, (url, _) in served.items():
            async with a2a(url) as client:
                ids[name] = task_id_of(await collect(client.send_message(question(f"{name}?"))))
    with keel_serve(tmp_path, STEPS, name="k", store=store) as (url, process):
        async with a2a(url) as client:
            sent = client.send_message(question("Slow?"))
            ids["working"] = (await anext(sent)).task.id
            await sent.aclose()
            slow = client.send_message(question("Cancel me?"))
            ids["canceled"] = (await anext(slow)).task.id
            await slow.aclose()
            await client.cancel_task(CancelTaskRequest(id=ids["canceled"]))
        process.kill()  # SIGKILL, mid-run
        process.wait()
    with keel_serve(tmp_path, STEPS, name="k", store=store) as (url, _):
        async with a2a(url) as client:
            states = {
                name: (await client.get_task(GetTaskRequest(id=task_id))).status
                for name, task_id in ids.items()
            }
            resumed = await collect(client.subscribe(SubscribeToTaskRequest(id=ids["working"])))
    assert {name: TaskState.Name(s.state) for name, s in states.items()} == {
        "completed": "TASK_STATE_COMPLETED",
        "failed": "TASK_STATE_FAILED",
        "input_required": "TASK_STATE_INPUT_REQUIRED",
        "working": "TASK_STATE_WORKING",  # taken up again by the restarted server
        "canceled": "TASK_STATE_CANCELED",
    }
    failure = get_data_parts(states["failed"].message.parts)[0]
    assert failure["kind"] == "ModelError" and "malformed" in failure["message"]
    assert final_state(resumed) == TaskState.TASK_STATE_COMPLETED


async def test_a_task_decided_while_the_server_was_down_goes_on_when_it_starts(
    tmp_path: Path,
) -> None:
    with keel_serve(tmp_path, WRITE, "--allow-writes", name="w") as (url, _):
        async with a2a(url) as client:
            task_id, call = await paused(client)
    approved = subprocess.run(
        [sys.executable, "-m", "keel", "approve", task_id, call["call_id"], "--store",
         str(tmp_path / "runs.db")],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": SRC}, check=False,
    )  # fmt: skip
    assert approved.returncode == 0, approved.stderr
    with keel_serve(tmp_path, WRITE, "--allow-writes", name="w") as (url, _):
        async with a2a(url) as client:
            for _ in range(100):  # taken up at start: it may be done before we ask
                task = await client.get_task(GetTaskRequest(id=task_id))
                if task.status.state == TaskState.TASK_STATE_COMPLETED:
                    break
                await asyncio.sleep(0.1)
    assert task.status.state == TaskState.TASK_STATE_COMPLETED
    assert (tmp_path / "repo" / "out.txt").read_text() == "hello\n"


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
            card = (await http.get(url + "/.well-known/agent-card.json")).json()
        assert [bare.status_code, wrong.status_code, rest.status_code] == [401, 401, 401]
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
