"""`keel serve` against what a hostile page, client or second server sends (tracker issue 33,
ADR 0047): real `keel serve` processes on loopback, real HTTP, the official `a2a-sdk` client.

Each case was seen failing before its fix: a cross-site POST served, a 5 MiB A2A body run,
a half-valid reply recording its first decision, another folder's server doing the write,
a huge page token an internal error, a parse error a traceback, concurrent follow-ups
branching the conversation, and `keel ui`'s index waiting behind 100 live streams.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.client import A2AClientError
from a2a.types import GetTaskRequest, ListTasksRequest, TaskState
from a2a.utils.errors import InvalidParamsError

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
    keel_servers,
    paused,
    question,
    runs_in,
    stop,
    task_id_of,
)
from keel.store import RunRecord, open_store

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def answer_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("hostile_answer")
    with keel_serve(tmp, ANSWER) as (url, _):
        yield Served(url, tmp)


@pytest.fixture(scope="module")
def write_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("hostile_write")
    with keel_serve(tmp, WRITE, "--allow-writes") as (url, _):
        yield Served(url, tmp)


@contextmanager
def serving(
    script: Path, repo: Path, store: Path, *extra: str
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """A `keel serve` of `script` (its own path: the model spec) in `repo`, on `store`."""
    repo.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": SRC, "HOME": str(store.parent)}
    env.pop("KEEL_SERVE_TOKEN", None)
    args = [sys.executable, "-m", "keel", "serve", "--port", "0", "--model", f"script:{script}",
            "--store", str(store), "--repo", str(repo), *extra]  # fmt: skip
    process = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        assert process.stdout is not None and process.stderr is not None
        url = process.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), process.stderr.read()
        yield url, process
    finally:
        stop([process])


AG_UI_RUN = {"threadId": "t1", "runId": "r1",
             "messages": [{"id": "m1", "role": "user", "content": "Sneak in?"}]}  # fmt: skip
SEND = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
        "params": {"message": {"messageId": "m1", "role": "ROLE_USER",
                               "parts": [{"text": "Sneak in?"}]}}}  # fmt: skip
A2A = {"A2A-Version": "1.0"}


def sse(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


# -- cross-site requests -----------------------------------------------------------------------


async def test_a_cross_site_request_is_refused_on_every_route_that_acts(tmp_path: Path) -> None:
    """A page elsewhere can POST `text/plain` to loopback without a preflight, with its own
    Origin; the Host guard cannot see it. With or without a token, it is refused."""
    with keel_serve(tmp_path, ANSWER) as (url, _):
        own = {"Origin": url}
        evil = {"Origin": "http://evil.example"}
        plain = {"Content-Type": "text/plain"}
        body = json.dumps(AG_UI_RUN)
        async with httpx.AsyncClient(timeout=30) as http:
            refused = [
                await http.post(url + "/ag-ui", content=body, headers={**plain, **evil}),
                await http.post(url + "/ag-ui", content=body, headers=plain),
                await http.post(url + "/ag-ui", json=AG_UI_RUN, headers=evil),
                await http.post(url + "/ag-ui", json=AG_UI_RUN, headers={"Origin": "null"}),
                await http.post(url + "/a2a/jsonrpc", json=SEND, headers={**evil, **A2A}),
                await http.post(
                    url + "/a2a/jsonrpc", content=json.dumps(SEND), headers={**plain, **A2A}
                ),
                await http.post(
                    url + "/a2a/rest/message:send", json=SEND["params"], headers={**evil, **A2A}
                ),
                await http.post(
                    url + "/a2a/rest/tasks/run_x:cancel", content="{}", headers={**plain, **A2A}
                ),
            ]
            assert [r.status_code for r in refused] == [403, 415, 403, 403, 403, 415, 403, 415]
            assert "another site" in refused[0].text and "application/json" in refused[1].text
            assert runs_in(tmp_path / "runs.db") == []
            same_site = await http.post(url + "/ag-ui", json=AG_UI_RUN, headers=own)
            assert same_site.status_code == 200  # a page of this server's own is served
            assert sse(same_site.text)[-1]["type"] == "RUN_FINISHED"
    with keel_serve(tmp_path, ANSWER, "--token", "s3cret", name="t", store=tmp_path / "t.db") as (
        url,
        _,
    ):
        bearer = {"Authorization": "Bearer s3cret"}
        async with httpx.AsyncClient(timeout=30) as http:
            with_token = [
                await http.post(url + "/ag-ui", content=json.dumps(AG_UI_RUN),
                                headers={**bearer, "Content-Type": "text/plain"}),
                await http.post(url + "/ag-ui", json=AG_UI_RUN,
                                headers={**bearer, "Origin": "http://evil.example"}),
                await http.post(url + "/a2a/jsonrpc", json=SEND,
                                headers={**bearer, **A2A, "Origin": "http://evil.example"}),
            ]  # fmt: skip
        assert [r.status_code for r in with_token] == [415, 403, 403]
        assert runs_in(tmp_path / "t.db") == []


async def test_an_a2a_body_past_4_mib_is_refused_with_a_json_rpc_error(
    answer_server: Served,
) -> None:
    before = len(runs_in(answer_server.store))
    huge = json.loads(json.dumps(SEND))
    huge["params"]["message"]["parts"][0]["text"] = "x" * (5 * MiB)
    async with httpx.AsyncClient(timeout=60) as http:
        rpc = await http.post(answer_server.url + "/a2a/jsonrpc", json=huge, headers=A2A)
        rest = await http.post(
            answer_server.url + "/a2a/rest/message:send", json=huge["params"], headers=A2A
        )
    assert rpc.status_code == 413
    error = rpc.json()["error"]
    assert error["code"] == -32600 and "4 MiB" in error["message"]
    assert rpc.json()["jsonrpc"] == "2.0"
    assert rest.status_code == 413 and "4 MiB" in rest.json()["error"]["message"]
    assert len(runs_in(answer_server.store)) == before
    async with a2a(answer_server.url) as client:  # the SDK's client says why, too
        text = question("x" * (5 * MiB))
        with pytest.raises(A2AClientError, match=r"4 MiB|413"):
            await collect(client.send_message(text))
    assert len(runs_in(answer_server.store)) == before


# -- decisions -----------------------------------------------------------------------------------


def stored_run(store: Path | str, run_id: str) -> RunRecord:
    """The run as recorded, read from the store itself (a SQLite file or a Postgres URL)."""
    db = open_store(store)
    try:
        record = db.get_run(run_id)
    finally:
        db.close()
    assert record is not None
    return record


async def all_or_nothing(url: str, store: Path | str, written: Path) -> None:
    """A reply half valid, then one deciding a call twice: neither records anything and the
    task still asks; then a valid reply completes the run, the write done once."""
    async with a2a(url) as client:
        task_id, call = await paused(client)
        call_id = call["call_id"]
        half = decisions(task_id, {"call_id": call_id, "approve": True},
                         {"call_id": "k9_9", "approve": True})  # fmt: skip
        with pytest.raises(InvalidParamsError) as refused:
            await collect(client.send_message(half))
        assert stored_run(store, task_id).state.decisions == {}, "the valid half was recorded"
        assert "nothing recorded: k9_9" in str(refused.value)
        assert f"Calls waiting: {call_id}" in str(refused.value)
        twice = decisions(task_id, {"call_id": call_id, "approve": True},
                          {"call_id": call_id, "approve": False, "reason": "no"})  # fmt: skip
        with pytest.raises(InvalidParamsError, match="decided twice"):
            await collect(client.send_message(twice))
        task = await client.get_task(GetTaskRequest(id=task_id))
        assert task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED  # not `working` for ever
        assert stored_run(store, task_id).state.decisions == {}
        after = await collect(
            client.send_message(decisions(task_id, {"call_id": call_id, "approve": True}))
        )
    assert final_state(after) == TaskState.TASK_STATE_COMPLETED
    assert written.read_text() == "hello\n"


async def test_decisions_in_one_message_are_taken_all_or_nothing(write_server: Served) -> None:
    written = write_server.tmp / "repo" / "out.txt"
    written.unlink(missing_ok=True)
    await all_or_nothing(write_server.url, write_server.store, written)


async def test_on_postgres_decisions_in_one_message_are_taken_all_or_nothing(
    tmp_path: Path, pg_url: str
) -> None:
    with keel_servers(tmp_path, {"s": (WRITE, ("--allow-writes",))}, pg_url) as served:
        url, _ = served["s"]
        await all_or_nothing(url, pg_url, tmp_path / "repo" / "out.txt")


# -- a run goes on only where its agent is -------------------------------------------------------


async def test_a_run_is_continued_only_by_a_server_with_its_folder(tmp_path: Path) -> None:
    """Same model, same tools, another `--repo`: the approved write must not land there."""
    script = tmp_path / "write.json"
    script.write_text(json.dumps(WRITE))
    store = tmp_path / "runs.db"
    mine, other = tmp_path / "mine", tmp_path / "other"
    with serving(script, mine, store, "--allow-writes") as (url, _):
        async with a2a(url) as client:
            task_id, call = await paused(client)
    with serving(script, other, store, "--allow-writes") as (url, _):
        async with a2a(url) as client:
            approve = decisions(task_id, {"call_id": call["call_id"], "approve": True})
            with pytest.raises(InvalidParamsError, match=f"cannot go on here: it works in {mine}"):
                await collect(client.send_message(approve))
    assert not (other / "out.txt").exists() and not (mine / "out.txt").exists()
    [run] = runs_in(store)
    assert run.status == "awaiting_approval" and run.state.decisions == {}


async def test_an_ag_ui_resume_on_another_model_is_refused_before_it_is_recorded(
    tmp_path: Path,
) -> None:
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    first.write_text(json.dumps(WRITE))
    second.write_text(json.dumps({"turns": [{"text": "Another model's answer."}]}))
    store, repo = tmp_path / "runs.db", tmp_path / "repo"
    with serving(first, repo, store, "--allow-writes") as (url, _):
        async with httpx.AsyncClient(timeout=30) as http:
            started = sse((await http.post(url + "/ag-ui", json=AG_UI_RUN)).text)
    run_id = next(e for e in started if e.get("name") == "keel.run")["value"]["run_id"]
    [interrupt] = started[-1]["outcome"]["interrupts"]
    resume = {
        **AG_UI_RUN,
        "runId": "r2",
        "resume": [
            {"interruptId": interrupt["id"], "status": "resolved", "payload": {"approved": True}}
        ],
    }
    with serving(second, repo, store, "--allow-writes") as (url, _):
        async with httpx.AsyncClient(timeout=30) as http:
            refused = await http.post(url + "/ag-ui", json=resume)
    assert refused.status_code == 409
    assert f"run {run_id} cannot go on here: it runs on script:{first}" in refused.json()["error"]
    [run] = runs_in(store)
    assert run.status == "awaiting_approval" and run.state.decisions == {}
    assert not (repo / "out.txt").exists()


# -- what a task shows ---------------------------------------------------------------------------


def nested(depth: int) -> Any:
    value: Any = "bottom"
    for _ in range(depth):
        value = {"k": [value]}
    return value


async def test_tool_arguments_nested_too_deep_are_shown_shortened(tmp_path: Path) -> None:
    """Protobuf refuses a message nested past 100 levels: such arguments made the task one
    that could be neither read nor decided."""
    script = {"turns": [
        {"tool_calls": [{"name": "write_file", "arguments": {
            "path": "out.txt", "content": "hello\n", "append": True, "extra": nested(60)}}]},
        {"text": "Wrote out.txt."}]}  # fmt: skip
    with keel_serve(tmp_path, script, "--allow-writes") as (url, _):
        async with a2a(url) as client:
            task_id, call = await paused(client)
            task = await client.get_task(GetTaskRequest(id=task_id))
            approve = decisions(task_id, {"call_id": call["call_id"], "approve": True})
            after = await collect(client.send_message(approve))
    extra = next(a["value"] for a in call["arguments"] if a["name"] == "extra")
    shown = json.dumps(extra)
    assert "nested deeper than 20 levels: shortened" in shown
    assert '"path"' not in shown and call["arguments"][0] == {"name": "path", "value": "out.txt"}
    assert task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED and len(task.history) > 3
    assert final_state(after) == TaskState.TASK_STATE_COMPLETED


# -- malformed requests --------------------------------------------------------------------------


async def test_malformed_json_rpc_is_one_log_line_and_a_huge_page_token_a_clear_error(
    tmp_path: Path,
) -> None:
    script = tmp_path / "answer.json"
    script.write_text(json.dumps(ANSWER))
    with serving(script, tmp_path / "repo", tmp_path / "runs.db") as (url, process):
        bad = [
            {**SEND, "params": {"message": 5}},
            {**SEND, "params": {"message": {"parts": "no"}}},
            {"jsonrpc": "2.0", "id": 2, "method": 7},
        ]
        async with httpx.AsyncClient(timeout=30) as http:
            answers = [
                (await http.post(url + "/a2a/jsonrpc", json=b, headers=A2A)).json() for b in bad
            ]
        assert all("error" in a for a in answers), answers
        async with a2a(url) as client:
            for token in ("9" * 4000, "9" * 40, "-3", "١٢", "abc"):
                with pytest.raises(InvalidParamsError, match="is not one this server gave"):
                    await client.list_tasks(ListTasksRequest(page_token=token))
            listed = await client.list_tasks(ListTasksRequest(page_token="0"))
        assert listed.total_size == 0
        process.terminate()  # to read all it logged
        _, logged = process.communicate(timeout=30)
    parse_lines = [line for line in logged.splitlines() if "Code=-32602" in line]
    assert len(parse_lines) >= 2, logged[-3000:]  # each said, once, in a line
    assert "Traceback" not in logged, logged[-3000:]


async def test_concurrent_follow_ups_on_one_conversation_do_not_branch_it(
    answer_server: Served,
) -> None:
    """Held before issue 33 in one process (the store refuses a follow-up on a run not ended,
    and a run is recorded before the next request is read); kept as a guard."""
    async with a2a(answer_server.url) as client:
        first = await collect(client.send_message(question("First?")))
        context = first[0].task.context_id

        async def follow_up(n: int) -> str:
            try:
                events = await collect(
                    client.send_message(question(f"And {n}?", context_id=context))
                )
            except InvalidParamsError as refused:
                return f"refused: {refused}"
            return task_id_of(events)

        outcomes = await asyncio.gather(*(follow_up(n) for n in range(5)))
    ran = [o for o in outcomes if not o.startswith("refused")]
    assert len(ran) == 1, outcomes
    assert all("has not ended" in o for o in outcomes if o not in ran)
    chain = [r for r in runs_in(answer_server.store) if r.conversation_id == context]
    continued = [r.config.continues_from for r in chain if r.config.continues_from]
    assert continued == [task_id_of(first)], "the conversation branched"


# -- keel ui under many live streams -------------------------------------------------------------


def test_keel_uis_index_answers_while_100_live_streams_are_open(tmp_path: Path) -> None:
    """100 streams opened at once on a big run's live endpoint, without `after` (each then
    reads and draws the run whole): the index waited 7 to 9 s behind them (all 100 draws);
    now a few streams work at a time, off the event loop. The bound is counted in draws, timed
    on this machine (the run's page, alone, reads and draws the run whole): a slow machine
    took 2.5 to 3.5 s, 3 to 4 draws of 0.85 s."""
    from big_runs import paused_run

    path = tmp_path / "runs.sqlite"
    run_id, _ = paused_run(path, 2_000, 100)
    env = {**os.environ, "PYTHONPATH": SRC}
    server = subprocess.Popen(
        [sys.executable, "-m", "keel", "ui", "--store", str(path), "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
    )  # fmt: skip

    async def probe(base: str) -> tuple[float, list[float]]:
        limits = httpx.Limits(max_connections=120)
        async with httpx.AsyncClient(timeout=60, limits=limits) as http:
            draws = []
            for _ in range(2):
                started = time.monotonic()
                page = await http.get(f"{base}runs/{run_id}")
                draws.append(time.monotonic() - started)
                assert page.status_code == 200
            live = http.build_request("GET", f"{base}runs/{run_id}/live")
            streams = await asyncio.gather(*(http.send(live, stream=True) for _ in range(100)))
            assert {s.status_code for s in streams} == {200}
            took = []
            async with httpx.AsyncClient(timeout=60) as other:
                for _ in range(3):
                    started = time.monotonic()
                    index = await other.get(base)
                    took.append(time.monotonic() - started)
                    assert index.status_code == 200 and run_id in index.text
            for stream in streams:
                await stream.aclose()
        return min(draws), took

    try:
        assert server.stdout is not None
        base = server.stdout.readline().strip()
        draw, took = asyncio.run(probe(base))
    finally:
        server.terminate()
        server.wait(30)
        if server.stdout is not None:
            server.stdout.close()
    bound = max(3.0, 6 * draw)  # 100 streams' worth of draws is what the index waited before
    shown = [round(t, 2) for t in took]
    assert max(took) < bound, f"the index took {shown} s; one draw of the run {draw:.2f} s"
