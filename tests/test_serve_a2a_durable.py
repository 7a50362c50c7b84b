"""`keel serve` over A2A, what outlives a connection or the server (ADR 0040): cancel, a
dropped stream resubscribed, a SIGKILLed server restarted, a decision made while it was down."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from a2a.helpers.proto_helpers import get_data_parts
from a2a.types import (
    CancelTaskRequest,
    GetTaskRequest,
    SubscribeToTaskRequest,
    TaskState,
)
from a2a.utils.errors import (
    TaskNotCancelableError,
    UnsupportedOperationError,
)

from a2a_serving import (
    ANSWER,
    FAILS,
    SRC,
    STEPS,
    WRITE,
    Spec,
    a2a,
    collect,
    final_state,
    keel_serve,
    keel_servers,
    paused,
    question,
    runs_in,
    seq_of,
    task_id_of,
)

# -- cancel, resubscribe, restart --------------------------------------------------------------


async def test_cancel_ends_the_run_cancelled(tmp_path: Path) -> None:
    """Mid-run, during the model call after a tool's result was recorded: recorded
    `cancelled`, and every event recorded before it is still there."""
    script = {
        "turns": [
            {"tool_calls": [{"name": "list_files", "arguments": {"path": "."}}]},
            {"text": "late"},
        ],
        "latency_ms": 1_500,
    }
    with keel_serve(tmp_path, script) as (url, _):
        async with a2a(url) as client:
            sent = client.send_message(question("Take your time."))
            task_id = (await anext(sent)).task.id
            async for event in sent:  # until the tool's result is recorded
                data = get_data_parts(event.status_update.status.message.parts)
                if data and data[0]["type"] == "tool_result":
                    break
            await sent.aclose()
            task = await asyncio.wait_for(client.cancel_task(CancelTaskRequest(id=task_id)), 10)
            again = await client.get_task(GetTaskRequest(id=task_id))
            with pytest.raises(TaskNotCancelableError, match="already ended"):
                await client.cancel_task(CancelTaskRequest(id=task_id))
    assert task.status.state == again.status.state == TaskState.TASK_STATE_CANCELED
    [run] = runs_in(tmp_path / "runs.db")
    assert run.status == "cancelled"
    kinds = [get_data_parts(m.parts)[0]["type"] for m in again.history[1:]]
    assert kinds[0] == "run_started" and kinds[-1] == "run_cancelled"
    assert "tool_result" in kinds and kinds.count("model_request") == 2


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
            try:  # the resumed run may end between get_task and subscribe (a busy machine)
                resumed = await collect(
                    client.subscribe(SubscribeToTaskRequest(id=ids["working"]))
                )
                ended = final_state(resumed)
            except UnsupportedOperationError:  # A2A: no subscribing to a task that has ended
                ended = (await client.get_task(GetTaskRequest(id=ids["working"]))).status.state
    assert {name: TaskState.Name(s.state) for name, s in states.items()} == {
        "completed": "TASK_STATE_COMPLETED",
        "failed": "TASK_STATE_FAILED",
        "input_required": "TASK_STATE_INPUT_REQUIRED",
        "working": "TASK_STATE_WORKING",  # taken up again by the restarted server
        "canceled": "TASK_STATE_CANCELED",
    }
    failure = get_data_parts(states["failed"].message.parts)[0]
    assert failure["kind"] == "ModelError" and "malformed" in failure["message"]
    assert ended == TaskState.TASK_STATE_COMPLETED


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


async def test_sigterm_stops_a_run_after_its_step_and_a_restart_finishes_it(
    tmp_path: Path,
) -> None:
    script = {
        "turns": [
            {"tool_calls": [{"name": "list_files", "arguments": {"path": "."}}]},
            {"text": "Finished after the restart."},
        ],
        "latency_ms": 1_500,
    }
    with keel_serve(tmp_path, script) as (url, process):
        async with a2a(url) as client:
            sent = client.send_message(question("Long?"))
            task_id = (await anext(sent)).task.id
            await sent.aclose()
        process.send_signal(signal.SIGTERM)  # inside the first model call
        assert process.wait(30) == 0
    [run] = runs_in(tmp_path / "runs.db")
    assert (run.status, run.state.step) == ("running", 1)  # its step saved, left to go on
    with keel_serve(tmp_path, script) as (url, _):
        async with a2a(url) as client:
            for _ in range(100):
                task = await client.get_task(GetTaskRequest(id=task_id))
                if task.status.state == TaskState.TASK_STATE_COMPLETED:
                    break
                await asyncio.sleep(0.1)
    assert task.artifacts[0].parts[0].text == "Finished after the restart."
