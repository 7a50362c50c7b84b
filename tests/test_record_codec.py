"""Every stored shape goes through the one codec (keel.codec), derived from its fields: each
event type and the run's settings round-trip through the store's JSON for any values their
fields' types allow (hypothesis draws them from the annotations, so a new field or a new event
type is covered without an edit here), and the stored forms `keel show --json` and older
readers depend on are kept."""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from enum import Enum
from typing import Any, get_args

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keel import records
from keel.codec import FLAT
from keel.errors import ToolLoopDetected
from keel.limits import LOOP_POLICIES, Limits
from keel.messages import SynthesisReason
from keel.records import (
    Ending,
    Event,
    ModelResponseReceived,
    RecordedCall,
    RunCancelled,
    RunCompleted,
    RunConfig,
    RunFailed,
    RunState,
    UnknownEvent,
    decode_event,
    encode_event,
)
from keel.result import Failure

JSON_SCALARS = st.none() | st.booleans() | st.integers() | st.text(max_size=8)
JSON = st.recursive(
    JSON_SCALARS | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=8,
)
READ_BACK_ONLY = {"elided"}
"""Fields never written: they are set when the record is read, not stored."""


def _names(cls: type[Any]) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def _of_type(tp: Any) -> st.SearchStrategy[Any]:
    """Values of an annotation, as the codec reads annotations."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return JSON
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*(st.none() if a is type(None) else _of_type(a) for a in args))
    if origin is typing.Literal:
        return st.sampled_from(args)
    if origin is tuple:
        return st.lists(_of_type(args[0]), max_size=3).map(tuple)
    if origin is dict:
        return st.dictionaries(st.text(max_size=6), _of_type(args[1]), max_size=3)
    if isinstance(tp, type) and issubclass(tp, Enum):
        return st.sampled_from(list(tp))
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _dataclass(tp)
    simple: dict[Any, st.SearchStrategy[Any]] = {
        bool: st.booleans(),
        int: st.integers(min_value=-(2**53), max_value=2**53),
        float: st.floats(allow_nan=False, allow_infinity=False),
        str: st.text(max_size=12),
    }
    return simple[tp]


def _keys_beside(cls: type[Any]) -> st.SearchStrategy[str]:
    names = _names(cls)
    return st.text(max_size=8).filter(lambda k: k not in names)


def _dataclass(cls: type[Any], **given_: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    hints = typing.get_type_hints(cls, localns={"JsonObject": dict[str, Any], "JsonValue": Any})
    fields: dict[str, st.SearchStrategy[Any]] = {}
    for f in dataclasses.fields(cls):
        if not f.init or f.name in READ_BACK_ONLY:
            continue
        if f.name in given_:
            fields[f.name] = given_[f.name]
        elif f.metadata == FLAT:  # its keys sit beside the fields: none may name one
            fields[f.name] = st.dictionaries(_keys_beside(cls), JSON, max_size=3)
        else:
            fields[f.name] = _of_type(hints[f.name])
    return st.builds(cls, **fields)


EVENT_TYPES = [cls for cls in get_args(Event) if cls is not UnknownEvent]


def _stored(event: Event) -> Event:
    """Written as a store writes it (the JSON text, the body apart) and read back."""
    type_name, data, body = encode_event(event)
    text = json.dumps(data)
    return decode_event(type_name, event.seq, event.at, json.loads(text), body)


def test_every_event_type_is_one_the_store_reads_back() -> None:
    """A new event class added to `Event` must be known to the decoder, not shown raw."""
    assert {cls.type for cls in EVENT_TYPES} == set(records._KINDS)
    assert len(EVENT_TYPES) == len(records._KINDS)


@pytest.mark.parametrize("cls", EVENT_TYPES, ids=lambda cls: cls.type)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_every_event_type_round_trips_through_the_codec(
    cls: type[Any], data: st.DataObject
) -> None:
    event = data.draw(_dataclass(cls, seq=st.integers(0, 10**6)))
    assert _stored(event) == event


@settings(max_examples=80, deadline=None)
@given(
    config=_dataclass(
        RunConfig,
        limits=st.builds(
            Limits,
            loop_policy=st.sampled_from(LOOP_POLICIES),
            max_model_calls=st.none() | st.integers(1, 10**6),
            max_cost=st.none() | st.floats(0.01, 1e6),
            first_turn_tool=st.none() | st.booleans(),
        ),
    )
)
def test_the_run_config_round_trips_through_the_codec(config: RunConfig) -> None:
    """The tiers come back as they were in force (ADR 0050), everything else as it was."""
    stored = json.loads(json.dumps(config.encode()))
    assert RunConfig.decode(stored) == dataclasses.replace(config, limits=config.limits.in_force())


def test_the_settings_are_stored_flat_and_unset_conversation_ids_not_at_all() -> None:
    config = RunConfig(model="m", system_prompt="s", settings={"repo": "/r"}, agent="reviewer")
    stored = config.encode()
    assert stored["repo"] == "/r" and "settings" not in stored
    assert stored["agent"] == "reviewer" and "conversation_id" not in stored
    assert next(iter(stored)) == "repo"  # the settings first, as stores have always had them


def test_a_config_saved_before_loop_policies_reads_as_adr() -> None:
    old = {"model": "m", "system_prompt": "s", "limits": {"max_model_calls": 9}, "repo": "/r"}
    config = RunConfig.decode(old)
    assert config.limits.loop_policy == "adr" and config.limits.max_model_calls == 9
    assert config.settings == {"repo": "/r"}


def test_empty_provider_details_and_a_missing_provider_id_are_not_stored() -> None:
    event = ModelResponseReceived(text="t", tool_calls=(RecordedCall("k1", "read_file", "{}"),))
    _, data, _ = encode_event(event)
    assert "provider_details" not in data
    assert data["tool_calls"] == [{"id": "k1", "name": "read_file", "arguments": "{}"}]


def test_a_failures_details_sit_beside_its_fields() -> None:
    _, data, _ = encode_event(RunFailed(kind="loop_detected", message="m", details={"count": 5}))
    assert data == {"count": 5, "step": 0, "kind": "loop_detected", "message": "m"}


# --- the run's ending -------------------------------------------------------------------------


def test_a_completed_ending_gives_the_state_and_the_event_the_same_values() -> None:
    ending = Ending.completed(
        4, "done", SynthesisReason.BUDGET, cut_off=True, output={"a": 1}, gaps=("g",)
    )
    state = RunState(step=4)
    state.end(ending)
    event = ending.event()
    assert isinstance(event, RunCompleted)
    for f in dataclasses.fields(RunCompleted):
        if f.name not in ("seq", "at"):
            assert getattr(event, f.name) == getattr(state, f.name), f.name
    assert state.status == "completed" and state.partial and event.partial


def test_a_failure_is_converted_once_for_the_state_the_result_and_the_event() -> None:
    error = ToolLoopDetected("read_file repeated", step=3, details={"count": 5})
    ending = Ending.failed(error)
    state = RunState(step=3)
    state.end(ending)
    event = ending.event()
    assert isinstance(event, RunFailed)
    assert state.failure == Failure("ToolLoopDetected", "read_file repeated", 3, {"count": 5})
    assert (event.kind, event.message, event.step, event.details) == (
        "ToolLoopDetected", "read_file repeated", 3, {"count": 5}
    )
    result = state.result("r1")
    assert result.status == "failed" and result.failure == state.failure


def test_every_ending_field_but_its_step_is_a_state_field() -> None:
    """`RunState.end` sets the state's fields by the ending's names."""
    state_fields = {f.name for f in dataclasses.fields(RunState)}
    assert {f.name for f in dataclasses.fields(Ending)} - {"step"} <= state_fields
    assert Ending.paused(2).event() is None
    assert Ending.cancelled(2).event() == RunCancelled(step=2)
