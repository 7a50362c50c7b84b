"""The typed run records (`keel.records`): one encoding per event kind, tolerant decoding, and
stores written before the records were typed still load, show and resume."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import keel
from keel import approvals
from keel.codec import from_json, to_json
from keel.messages import SynthesisReason, Usage
from keel.records import (
    ApprovalDecided,
    Decision,
    ModelRequestSent,
    ModelResponseReceived,
    RecordedCall,
    RunConfig,
    RunFailed,
    RunState,
    ToolResultRecorded,
    UnknownEvent,
    decode_event,
    encode_event,
)
from keel.result import PendingApproval
from keel.transports.scripted import ScriptedTransport

OLD_STORE = Path(__file__).parent / "data" / "store-0.1.sqlite"
"""Written by Keel at commit 8553108 (untyped events): a run completed by repeated-tool
synthesis, one failed with ToolLoopDetected, and one paused with one call denied, one pending."""


def test_every_event_kind_round_trips_through_its_one_encoding() -> None:
    events = [
        ModelResponseReceived(
            step=2,
            text=None,
            tool_calls=(RecordedCall("c1", "fetch", '{"url": "x"}'),),
            usage=keel.Usage(10, 2, 4),
            provider_details={"openai_responses": {"output": [{"type": "reasoning"}]}},
        ),
        ToolResultRecorded(step=2, call_id="c1", call_key="k", name="fetch", content="body"),
        RunFailed(step=3, kind="ToolLoopDetected", message="m", details={"count": 5}),
        ApprovalDecided(
            step=1, call_id="c1", name="w", call_key="k", approved=False, by="ana", reason="no"
        ),
    ]
    for event in events:
        type_, data, body = encode_event(event)
        assert decode_event(type_, event.seq, event.at, data, body) == event


def test_failure_details_are_stored_flat_as_keel_show_prints_them() -> None:
    _, data, _ = encode_event(RunFailed(step=3, kind="ModelError", message="m", details={"a": 1}))
    assert data == {"a": 1, "step": 3, "kind": "ModelError", "message": "m"}


def test_unknown_or_incomplete_events_are_kept_not_dropped() -> None:
    newer = decode_event("run_migrated", 7, 1.0, {"step": 2, "to": "pg"})
    assert isinstance(newer, UnknownEvent) and newer.type_name == "run_migrated"
    assert encode_event(newer) == ("run_migrated", {"step": 2, "to": "pg"}, None)
    broken = decode_event("tool_call", 8, 1.0, {"step": 2})
    assert isinstance(broken, UnknownEvent) and broken.data == {"step": 2}


def test_run_state_and_config_round_trip() -> None:
    state = RunState(
        step=4,
        model_calls=5,
        status="awaiting_approval",
        pending=(PendingApproval("c2", "w", {"path": "a"}, "w {}"),),
        decisions={"c1": Decision(False, "ana", "no")},
        denied={"w {}": Decision(False, "ana", "no")},
        transport={"next": 3},
    )
    assert RunState.decode(state.encode()) == state
    config = RunConfig("script:x", "sys", ("fetch",), ("fetch",), keel.Limits(loop_threshold=3))
    assert RunConfig.decode(config.encode()) == config


def test_a_store_written_before_typed_records_loads_shows_and_resumes(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    shutil.copy(OLD_STORE, path)
    store = keel.Store(path)
    runs = {r.question: r for r in store.list_runs()}
    assert runs["loop?"].state.synthesized == "repeated_tool"
    failed = runs["fail?"].state.failure
    assert failed is not None and failed.kind == "ToolLoopDetected"
    assert failed.details["call_key"] == 'note {"topic":"b"}'
    for record in runs.values():
        events = store.events(record.run_id)
        assert events and not [e for e in events if isinstance(e, UnknownEvent)]
        assert [e.seq for e in events] == list(range(len(events)))
    (last_failed,) = [e for e in store.events(runs["fail?"].run_id) if isinstance(e, RunFailed)]
    assert last_failed.details["threshold"] == 3

    paused = runs["publish?"]
    # saved before loop policies existed: it resumes counting as it started (ADR 0029)
    assert paused.config.limits == keel.Limits(loop_policy="adr")
    (waiting,) = approvals.pending(store, paused.run_id)
    approvals.approve(store, paused.run_id, waiting.call_id, by="ben")
    script = {
        "turns": [
            {
                "tool_calls": [
                    {"name": "publish", "arguments": {"text": "one"}},
                    {"name": "publish", "arguments": {"text": "two"}},
                ]
            },
            {"text": "after"},
        ]
    }

    @keel.tool(effect="side_effecting", requires_approval=True)
    def publish(text: str) -> str:
        """Publish a note."""
        return "posted " + text

    agent = keel.Agent(ScriptedTransport.from_dict(script), tools=[publish], store=store)
    result = agent.resume(paused.run_id)
    assert result.status == "completed" and result.answer == "after"
    results = [e for e in store.events(paused.run_id) if isinstance(e, ToolResultRecorded)]
    assert [r.content.split(".")[0] for r in results] == ["Denied by ana: not now", "posted two"]
    store.close()


def test_a_model_request_recorded_before_the_prompt_cache_share_loads_without_one() -> None:
    old = {"step": 1, "attempt": 1, "tool_choice": None, "synthesis": None, "items": 1,
           "estimated_input_tokens": 40}  # fmt: skip
    event = decode_event("model_request", 3, 1.0, old)
    assert isinstance(event, ModelRequestSent)
    assert (event.estimated_input_tokens, event.repeated_prefix_tokens) == (40, None)
    new = ModelRequestSent(
        step=2,
        attempt=1,
        tool_choice=None,
        synthesis=None,
        items=3,
        estimated_input_tokens=90,
        repeated_prefix_tokens=40,
    )
    type_, data, body = encode_event(new)
    assert decode_event(type_, new.seq, new.at, data, body) == new


def test_run_state_codec_is_derived_from_its_fields_so_a_new_field_round_trips() -> None:
    """A field added to the run state needs no edit in any codec: a subclass with two new
    fields (a plain one and a nested record) round-trips through the same encode/decode."""
    @dataclasses.dataclass(slots=True)
    class Grown(RunState):
        spent_usd: float = 0.0
        extra_usage: Usage | None = None

    state = Grown(step=4, spent_usd=0.25, extra_usage=Usage(7, 8, 9))
    state.usage = Usage(1, 2, 3)
    back = from_json(Grown, to_json(state))
    assert back == state
    assert from_json(Grown, {"step": 2}).spent_usd == 0.0  # an older store: the default


def test_run_state_decodes_a_store_written_before_the_codec() -> None:
    """Stores written by earlier versions keep opening: usage as a list, a denial without
    `approved`, a synthesis reason as text."""
    old = {
        "step": 3,
        "usage": [10, 2, 1],
        "synthesized": "budget",
        "failure": {"kind": "ModelError", "message": "m", "step": 3},
        "pending": [{"call_id": "c1", "name": "write_file", "arguments": {}, "call_key": "k"}],
        "denied": {"k": {"approved": False, "by": "ana", "reason": None}},
    }
    state = RunState.decode(old)
    assert state.usage == Usage(10, 2, 1)
    assert state.synthesized is SynthesisReason.BUDGET
    assert state.failure is not None and state.failure.details == {}
    assert state.pending[0].call_id == "c1"
    assert not state.denied["k"].approved
    assert RunState.decode(state.encode()) == state


def test_a_state_copy_shares_no_container_with_the_live_state() -> None:
    """`RunState.copy` is made from the fields: every dict (and any container field added
    later) is copied, so a snapshot a worker thread encodes never changes under it."""
    import dataclasses

    from keel.records import RunState

    state = RunState()
    twin = state.copy()
    containers = [
        f.name for f in dataclasses.fields(RunState)
        if isinstance(getattr(state, f.name), dict | list | set)
    ]  # fmt: skip
    assert {"decisions", "denied", "unknown_effects", "children"} <= set(containers)
    for name in containers:
        assert getattr(twin, name) is not getattr(state, name), name
        assert getattr(twin, name) == getattr(state, name), name
