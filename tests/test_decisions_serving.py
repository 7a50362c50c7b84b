"""The four decisions through `keel serve` (ADR 0052): A2A `keel_decisions` with the A2A
client, and AG-UI resume payloads, checked before anything is recorded."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from a2a.types import GetTaskRequest, TaskState
from a2a.utils.errors import InvalidParamsError

from a2a_serving import (
    WRITE,
    Served,
    a2a,
    collect,
    decisions,
    final_state,
    keel_serve,
    paused,
    runs_in,
)
from keel.records import ApprovalDecided, ToolResultRecorded
from test_serve_ag_ui import WRITE_SCRIPT, run_input, served, sse_events, stored, user, write_script


@pytest.fixture(scope="module")
def write_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("decide")
    with keel_serve(tmp, WRITE, "--allow-writes") as (url, _):
        yield Served(url, tmp)


async def test_a2a_approves_with_edited_arguments_bound_to_the_call_it_saw(
    write_server: Served,
) -> None:
    repo = write_server.tmp / "repo"
    async with a2a(write_server.url) as client:
        task_id, call = await paused(client)
        assert call["call_key"].startswith("write_file ")
        wrong_key = {"call_id": call["call_id"], "approve": True, "call_key": "write_file {}"}
        with pytest.raises(InvalidParamsError, match="nothing was recorded"):
            await collect(client.send_message(decisions(task_id, wrong_key)))
        unfit = {"call_id": call["call_id"], "approve": True, "arguments": {"path": 3}}
        with pytest.raises(InvalidParamsError, match="schema"):
            await collect(client.send_message(decisions(task_id, unfit)))
        edited = {
            "call_id": call["call_id"],
            "approve": True,
            "call_key": call["call_key"],
            "arguments": {"path": "edited.txt", "content": "edited\n"},
        }
        after = await collect(client.send_message(decisions(task_id, edited)))
        await client.get_task(GetTaskRequest(id=task_id))
    assert final_state(after) == TaskState.TASK_STATE_COMPLETED
    assert (repo / "edited.txt").read_text() == "edited\n"
    [run] = [r for r in runs_in(write_server.store) if r.run_id == task_id]
    decision = run.state.decisions[call["call_id"]]
    assert decision.arguments == {"path": "edited.txt", "content": "edited\n"}


async def test_a2a_answers_instead_and_approves_for_the_run(write_server: Served) -> None:
    async with a2a(write_server.url) as client:
        task_id, call = await paused(client)
        answer = {"call_id": call["call_id"], "answer": "Written by hand already."}
        after = await collect(client.send_message(decisions(task_id, answer)))
        assert final_state(after) == TaskState.TASK_STATE_COMPLETED
        [run] = [r for r in runs_in(write_server.store) if r.run_id == task_id]
        assert run.state.decisions[call["call_id"]].answer == "Written by hand already."
        assert run.state.tool_calls == 0

        task_id, call = await paused(client)
        rule = {"call_id": call["call_id"], "approve": True, "for_run": True}
        after = await collect(client.send_message(decisions(task_id, rule)))
    assert final_state(after) == TaskState.TASK_STATE_COMPLETED
    [run] = [r for r in runs_in(write_server.store) if r.run_id == task_id]
    assert set(run.state.approved_for_run) == {"write_file"}


def test_ag_ui_resumes_with_edited_arguments_an_answer_and_refuses_unfit_ones(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    store = tmp_path / "runs.sqlite"
    with served(write_script(tmp_path, WRITE_SCRIPT), store, repo) as (url, _):
        first = sse_events(httpx.post(url, json=run_input("t", "r0", user("Note")), timeout=30))
        run_id = first[1]["value"]["run_id"]
        unfit = {"approved": True, "arguments": {"path": "x.txt"}}
        entry = {"interruptId": f"{run_id}:k1_0", "status": "resolved", "payload": unfit}
        refused = httpx.post(url, json=run_input("t", "r1", resume=[entry]), timeout=30)
        assert refused.status_code == 409 and "content" in refused.json()["error"]
        edited = {"approved": True, "arguments": {"path": "edited.txt", "content": "e"}}
        entry["payload"] = edited
        done = sse_events(httpx.post(url, json=run_input("t", "r2", resume=[entry]), timeout=30))
        assert done[-1]["outcome"] == {"type": "success"}

        second = sse_events(httpx.post(url, json=run_input("u", "r3", user("Note")), timeout=30))
        other = second[1]["value"]["run_id"]
        answer = {"approved": False, "answer": "Done by hand."}
        entry = {"interruptId": f"{other}:k1_0", "status": "resolved", "payload": answer}
        done = sse_events(httpx.post(url, json=run_input("u", "r4", resume=[entry]), timeout=30))
        assert done[-1]["outcome"] == {"type": "success"}
    assert (repo / "edited.txt").read_text() == "e" and not (repo / "note.txt").exists()
    with stored(store) as db:
        (decided,) = [e for e in db.events(run_id) if isinstance(e, ApprovalDecided)]
        results = [e for e in db.events(other) if isinstance(e, ToolResultRecorded)]
    assert decided.arguments == {"path": "edited.txt", "content": "e"} and decided.by == "ag-ui"
    assert [(r.content, r.answered_by) for r in results] == [("Done by hand.", "ag-ui")]
