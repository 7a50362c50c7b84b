"""The store (ADR 0006) (what this issue covers: the event log and state saved per step),
"Approvals" (the pause, after the hard breaker), and the guarded public surface."""

from __future__ import annotations

import inspect
import json
import sqlite3
from pathlib import Path

import keel
from keel._run.breaker import tier_of
from keel._run.synthesis import BUDGET_CONTROL, REPEATED_TOOL_CONTROL
from keel.records import ApprovalRequested, ToolResultRecorded
from support import batch, call, run_script

ANSWER = {"text": "answer"}


@keel.tool
def note(topic: str) -> str:
    """Read a note."""
    return f"note on {topic}"


@keel.tool(effect="side_effecting", requires_approval=True)
def publish(text: str) -> str:
    """Publish text."""
    raise AssertionError("must not run before approval")


@keel.tool(effect="side_effecting", requires_approval=lambda args: args["text"].startswith("!"))
def post(text: str) -> str:
    """Post text; texts starting with ! need approval."""
    return "posted"


async def test_volatile_control_text_never_enters_the_store(tmp_path: Path) -> None:
    path = tmp_path / "runs.sqlite"
    store = keel.Store(path)
    turns = [call("note", topic="x")] * 2 + [ANSWER]
    out = await run_script(
        {"turns": turns}, [note], store=store, loop_threshold=3, max_model_calls=3
    )
    assert out.requests[-1].volatile[1:] == (BUDGET_CONTROL, REPEATED_TOOL_CONTROL)
    store.close()
    raw = b"".join(f.read_bytes() for f in tmp_path.iterdir())
    assert b"note on x" in raw  # the results are there, so the search below is meaningful
    for control in (BUDGET_CONTROL, REPEATED_TOOL_CONTROL):
        assert control[:40].encode() not in raw


async def test_each_step_is_checkpointed_with_counters_and_state(tmp_path: Path) -> None:
    store = keel.Store(tmp_path / "runs.sqlite")
    seen_mid_run: list[tuple[int, int]] = []

    @keel.tool(name="note")
    def peeking_note(topic: str) -> str:
        """Look a topic up; peeks at what another process would read from the store now."""
        with sqlite3.connect(tmp_path / "runs.sqlite") as other:
            (state,) = other.execute("SELECT state FROM runs").fetchone()
            (results,) = other.execute(
                "SELECT count(*) FROM events WHERE type = 'tool_result'"
            ).fetchone()
        seen_mid_run.append((json.loads(state)["step"], results))
        return f"note on {topic}"

    turns = [call("note", topic="a"), call("note", topic="a"), call("note", topic="b"), ANSWER]
    out = await run_script({"turns": turns}, [peeking_note], store=store)
    # While step N's tool runs, steps before it (and step N's model turn) are already saved.
    assert seen_mid_run == [(1, 0), (2, 1), (3, 2)]
    record = store.get_run(out.result.run_id)
    assert record is not None and record.status == "completed"
    assert record.state.model_calls == 4 and record.state.tool_calls == 3
    counters = store.counters(out.result.run_id)
    identical = {k: c.count for k, c in counters.items() if tier_of(k) is None}  # not a tier's
    assert identical == {
        'note {"topic":"a"}': 2,
        'note {"topic":"b"}': 1,
    }
    seqs = [e.seq for e in out.events]
    assert seqs == list(range(len(seqs)))
    db = sqlite3.connect(tmp_path / "runs.sqlite")
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


async def test_truncated_results_are_kept_whole_in_the_store() -> None:
    @keel.tool
    def huge() -> str:
        """A very long result."""
        return "0123456789" * 2_000

    out = await run_script({"turns": [call("huge"), ANSWER]}, [huge], max_result_chars=1_000)
    (result,) = out.of_type(ToolResultRecorded)
    assert result.truncated and len(result.content) < 1_200
    assert out.store.blob(result.digest) == "0123456789" * 2_000


async def test_call_requiring_approval_pauses_the_run_before_dispatch() -> None:
    out = await run_script({"turns": [call("publish", text="hello")]}, [publish])
    assert out.result.status == "awaiting_approval"
    (pending,) = out.result.pending_approvals
    assert pending.name == "publish" and pending.arguments == {"text": "hello"}
    assert out.of_type(ApprovalRequested)[0].call_key == 'publish {"text":"hello"}'
    assert not out.of_type(ToolResultRecorded)
    assert out.store.get_run(out.result.run_id).status == "awaiting_approval"  # type: ignore[union-attr]


async def test_approval_policy_can_be_a_predicate_on_arguments() -> None:
    out = await run_script(
        {"turns": [call("post", text="fine"), call("post", text="!urgent")]}, [post]
    )
    assert out.result.status == "awaiting_approval"
    assert [p.arguments["text"] for p in out.result.pending_approvals] == ["!urgent"]
    assert out.of_type(ToolResultRecorded)[0].content == "posted"


async def test_hard_breaker_runs_before_asking_for_approval() -> None:
    turn = batch(*[("post", {"text": "!same"})] * 3)
    out = await run_script({"turns": [turn]}, [post], loop_threshold=3)
    assert out.result.failure is not None and out.result.failure.kind == "ToolLoopDetected"
    assert not out.of_type(ApprovalRequested)


def test_public_surface_is_explicit() -> None:
    exported = set(keel.__all__)
    for name in exported:  # loaded on first use (ADR 0042): each must resolve
        getattr(keel, name)
    public = {
        name
        for name, value in vars(keel).items()
        if not name.startswith("_") and not inspect.ismodule(value)
    }
    assert exported == public
    for name in ("Agent", "Limits", "RunResult", "tool", "Effect", "ToolLoopDetected"):
        assert name in exported
