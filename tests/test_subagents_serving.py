"""A child's pause through `keel serve` (sub-agents, ADR 0046): a lead served over A2A hands a
write to a child agent; the child's approval makes the A2A task `input-required` with the
child's call, and one `keel_decisions` message on the lead's task resumes both."""

from __future__ import annotations

import json
from pathlib import Path

from a2a.types import GetTaskRequest, TaskState

from a2a_serving import WRITE, a2a, collect, decisions, final_state, keel_serve, paused
from keel.store import Store

LEAD = {
    "turns": [
        {"tool_calls": [{"name": "writer", "arguments": {"task": "Write hello to out.txt."}}]},
        {"text": "The writer wrote out.txt."},
    ]
}


async def test_a_childs_approval_is_the_served_tasks_input_required_and_one_decision_resumes_both(
    tmp_path: Path,
) -> None:
    child = tmp_path / "writer.json"
    child.write_text(json.dumps(WRITE))
    config = tmp_path / ".config" / "keel"  # `keel serve` runs with HOME = tmp_path
    config.mkdir(parents=True)
    (config / "keel.toml").write_text(
        f'[agents.writer]\ndescription = "Writes files"\nmodel = "script:{child}"\n'
        'tools = ["write_file"]\n'
    )
    written = tmp_path / "repo" / "out.txt"
    with keel_serve(tmp_path, LEAD, "--allow-writes", "--agent", "writer") as (url, _):
        async with a2a(url) as client:
            task_id, call = await paused(client)
            assert call["name"] == "write_file"
            child_run, _, child_call = call["call_id"].partition(":")
            assert child_run.startswith("run_") and child_call
            assert not written.exists()
            approve = {"call_id": call["call_id"], "approve": True}
            after = await collect(client.send_message(decisions(task_id, approve)))
            task = await client.get_task(GetTaskRequest(id=task_id))
    assert final_state(after) == TaskState.TASK_STATE_COMPLETED
    assert task.artifacts[0].parts[0].text == "The writer wrote out.txt."
    assert written.read_text() == "hello\n"  # once
    db = Store(tmp_path / "runs.db", read_only=True)
    try:
        record = db.get_run(child_run)
        assert record is not None and record.status == "completed"
        assert record.state.decisions[child_call].approved
    finally:
        db.close()
