"""The scripted model: each turn shape, consumption rules, errors, validation, latency."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path
from typing import Any

import pytest

from keel.canonical import call_key
from keel.errors import ConfigError, ProviderError
from keel.messages import ModelRequest, UserMessage
from keel.transports.base import Transport
from keel.transports.scripted import ScriptedTransport


def make_request(
    tool_choice: Any = None, volatile: tuple[str, ...] = (), tokens: int = 123
) -> ModelRequest:
    return ModelRequest(
        system="You research.",
        tools=(),
        items=(UserMessage("question"),),
        tool_choice=tool_choice,
        volatile=volatile,
        estimated_input_tokens=tokens,
    )


def script(*turns: Any, **extra: Any) -> ScriptedTransport:
    return ScriptedTransport.from_dict({"turns": list(turns), **extra})


def config_error(data: Any) -> str:
    with pytest.raises(ConfigError) as info:
        ScriptedTransport.from_dict(data, source="demo.json")
    return str(info.value)


# --- turn shapes ------------------------------------------------------------------------------


def test_is_a_transport_named_after_its_source() -> None:
    transport = ScriptedTransport.from_dict({"turns": []}, source="demo.json")
    assert isinstance(transport, Transport)
    assert transport.name == "script:demo.json"
    assert ScriptedTransport.from_dict({"turns": []}).name == "script:<dict>"


async def test_text_turn_answers_text() -> None:
    response = await script({"text": "The answer."}).request(make_request())
    assert response.text == "The answer."
    assert response.tool_calls == ()
    assert not response.is_empty


async def test_tool_calls_turn_answers_parsed_calls() -> None:
    transport = script(
        {"tool_calls": [{"name": "search", "arguments": {"q": "keel", "n": 1.0}}, {"name": "t"}]}
    )
    response = await transport.request(make_request())
    assert response.text is None
    first, second = response.tool_calls
    assert (first.name, first.arguments, first.parse_error) == (
        "search",
        {"q": "keel", "n": 1},
        None,
    )
    assert first.key == call_key("search", {"n": 1, "q": "keel"})
    assert second.arguments == {}
    assert second.raw_arguments == "{}"


async def test_turn_with_text_and_tool_calls_answers_both() -> None:
    response = await script(
        {"text": "Let me look.", "tool_calls": [{"name": "read", "arguments": {"path": "a"}}]}
    ).request(make_request())
    assert response.text == "Let me look."
    assert [c.name for c in response.tool_calls] == ["read"]


async def test_string_arguments_are_raw_text_the_model_wrote() -> None:
    transport = script(
        {"tool_calls": [{"name": "read", "arguments": '{"path": "a"}'}]},
        {"tool_calls": [{"name": "read", "arguments": '{"path": '}]},
    )
    valid = (await transport.request(make_request())).tool_calls[0]
    assert valid.raw_arguments == '{"path": "a"}'
    assert valid.arguments == {"path": "a"}
    assert valid.key == call_key("read", {"path": "a"})
    broken = (await transport.request(make_request())).tool_calls[0]
    assert broken.raw_arguments == '{"path": '
    assert broken.arguments is None
    assert broken.parse_error is not None and "not valid JSON" in broken.parse_error


async def test_empty_turn_answers_nothing() -> None:
    response = await script({"empty": True}).request(make_request())
    assert response.is_empty
    assert response.text is None and response.tool_calls == ()


async def test_tool_call_ids_are_unique_within_the_transport() -> None:
    call = {"name": "t", "arguments": {"a": 1}}
    transport = script({"tool_calls": [call, call]}, {"repeat": 2, "turn": {"tool_calls": [call]}})
    ids = []
    for _ in range(3):
        ids += [c.id for c in (await transport.request(make_request())).tool_calls]
    assert ids == ["call_1", "call_2", "call_3", "call_4"]


async def test_usage_takes_the_request_estimate_and_a_size_estimate_of_the_answer() -> None:
    transport = script({"text": "x" * 40}, {"empty": True}, {"tool_calls": [{"name": "t"}]})
    first = await transport.request(make_request(tokens=777))
    assert (first.usage.input_tokens, first.usage.output_tokens) == (777, 10)
    assert (await transport.request(make_request())).usage.output_tokens == 1
    assert (await transport.request(make_request())).usage.output_tokens == 1


# --- consumption ----------------------------------------------------------------------------


async def test_turns_are_consumed_in_order() -> None:
    transport = script({"text": "one"}, {"text": "two"})
    assert (transport.consumed, transport.remaining) == (0, 2)
    assert (await transport.request(make_request())).text == "one"
    assert (transport.consumed, transport.remaining) == (1, 1)
    assert (await transport.request(make_request())).text == "two"
    assert (transport.consumed, transport.remaining) == (2, 0)


async def test_repeat_expands_to_copies_and_nests() -> None:
    transport = script(
        {"repeat": 2, "turn": {"repeat": 3, "turn": {"text": "inner"}}},
        {"repeat": 1, "turn": {"text": "last"}},
    )
    assert transport.remaining == 7
    texts = [(await transport.request(make_request())).text for _ in range(7)]
    assert texts == ["inner"] * 6 + ["last"]


async def test_on_synthesis_answers_tool_choice_none_without_consuming() -> None:
    transport = script(
        {"tool_calls": [{"name": "t"}]},
        {"text": "normal"},
        on_synthesis={"text": "synthesized"},
    )
    assert (await transport.request(make_request(tool_choice="none"))).text == "synthesized"
    assert transport.consumed == 0
    assert (await transport.request(make_request())).tool_calls[0].name == "t"
    assert (await transport.request(make_request(tool_choice="none"))).text == "synthesized"
    assert (await transport.request(make_request())).text == "normal"
    assert transport.consumed == 2
    transport.assert_consumed()


async def test_without_on_synthesis_a_synthesis_request_consumes_a_turn() -> None:
    transport = script({"text": "from the turns"})
    assert (await transport.request(make_request(tool_choice="none"))).text == "from the turns"
    assert transport.consumed == 1


async def test_on_synthesis_may_misbehave_to_test_the_runtime() -> None:
    transport = script(on_synthesis={"tool_calls": [{"name": "search"}]})
    response = await transport.request(make_request(tool_choice="none"))
    assert response.tool_calls[0].name == "search"


async def test_running_out_raises_a_clear_non_retryable_provider_error() -> None:
    transport = ScriptedTransport.from_dict({"turns": [{"text": "only"}]}, source="demo.json")
    await transport.request(make_request())
    with pytest.raises(ProviderError) as info:
        await transport.request(make_request())
    assert not info.value.retryable
    assert "script:demo.json" in str(info.value)
    assert "the script has no turn left: 1 turns were consumed" in str(info.value)
    assert transport.consumed == 1


async def test_running_out_of_an_empty_script_is_not_an_index_error() -> None:
    with pytest.raises(ProviderError, match="no turn left: 0 turns"):
        await script().request(make_request())


async def test_assert_consumed_lists_leftover_turns() -> None:
    transport = script(
        {"text": "used"},
        {"tool_calls": [{"name": "search"}]},
        {"repeat": 2, "turn": {"error": {"status": 500}}},
    )
    await transport.request(make_request())
    with pytest.raises(AssertionError) as info:
        transport.assert_consumed()
    message = str(info.value)
    assert "3 of 4 turns were not used" in message
    assert "turns[1]: tool_calls search" in message
    assert "turns[2].turn: error 500" in message
    assert "used" not in message.replace("not used", "")


async def test_assert_consumed_passes_when_everything_was_used() -> None:
    transport = script({"text": "a"})
    await transport.request(make_request())
    transport.assert_consumed()
    script().assert_consumed()


async def test_assert_consumed_shortens_a_long_list() -> None:
    message = ""
    try:
        script({"repeat": 25, "turn": {"empty": True}}).assert_consumed()
    except AssertionError as exc:
        message = str(exc)
    assert "25 of 25" in message and "and 15 more" in message


# --- error turns ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "retryable"),
    [(429, True), (500, True), (503, True), (408, True), (400, False), (401, False), (404, False)],
)
async def test_error_turns_are_classified_by_status(status: int, retryable: bool) -> None:
    transport = script({"error": {"status": status, "message": "scripted trouble"}})
    with pytest.raises(ProviderError) as info:
        await transport.request(make_request())
    assert info.value.status == status
    assert info.value.retryable is retryable
    assert info.value.retry_after is None
    assert str(status) in str(info.value) and "scripted trouble" in str(info.value)
    assert transport.consumed == 1


async def test_error_turn_carries_retry_after() -> None:
    transport = script({"error": {"status": 429, "message": "slow down", "retry_after": 2}})
    with pytest.raises(ProviderError) as info:
        await transport.request(make_request())
    assert info.value.retry_after == 2.0


async def test_a_retry_consumes_the_next_turn() -> None:
    transport = script({"error": {"status": 503}}, {"text": "recovered"})
    with pytest.raises(ProviderError):
        await transport.request(make_request())
    assert (await transport.request(make_request())).text == "recovered"


async def test_each_error_is_a_fresh_exception() -> None:
    transport = script({"repeat": 2, "turn": {"error": {"status": 500}}})
    raised = []
    for _ in range(2):
        with pytest.raises(ProviderError) as info:
            await transport.request(make_request())
        raised.append(info.value)
    assert raised[0] is not raised[1]


# --- recording ------------------------------------------------------------------------------


async def test_record_keeps_every_request_sent() -> None:
    transport = ScriptedTransport.from_dict(
        {"turns": [{"text": "a"}], "on_synthesis": {"text": "s"}}, record=True
    )
    normal = make_request()
    synthesis = make_request(tool_choice="none", volatile=("Give your best answer now.",))
    await transport.request(normal)
    await transport.request(synthesis)
    with pytest.raises(ProviderError):
        await transport.request(normal)
    assert transport.requests == [normal, synthesis, normal]
    assert transport.requests[1].tool_choice == "none"
    assert transport.requests[1].volatile == ("Give your best answer now.",)


def test_requests_without_record_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="record=True"):
        _ = script().requests


# --- latency --------------------------------------------------------------------------------


async def test_latency_delays_every_answer() -> None:
    transport = script({"text": "a"}, {"error": {"status": 500}}, latency_ms=50)
    for _ in range(2):
        start = time.perf_counter()
        with contextlib.suppress(ProviderError):
            await transport.request(make_request())
        assert time.perf_counter() - start >= 0.045


async def test_concurrent_calls_take_turns_in_arrival_order() -> None:
    transport = script(*({"text": str(i)} for i in range(20)), latency_ms=20)
    start = time.perf_counter()
    responses = await asyncio.gather(*(transport.request(make_request()) for _ in range(20)))
    assert [r.text for r in responses] == [str(i) for i in range(20)]
    assert time.perf_counter() - start < 1.0  # the waits overlap


# --- loading and validation -----------------------------------------------------------------


def test_from_file_loads_a_script(tmp_path: Path) -> None:
    path = tmp_path / "demo.json"
    path.write_text(json.dumps({"turns": [{"text": "hi"}], "latency_ms": 0}), encoding="utf-8")
    transport = ScriptedTransport.from_file(path)
    assert transport.name == f"script:{path}"
    assert transport.remaining == 1


def test_from_file_bad_json_names_the_file_and_position(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text('{"turns": [\n  {"text": "a"},\n]}', encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        ScriptedTransport.from_file(path)
    assert str(path) in str(info.value)
    assert "not valid JSON" in str(info.value) and "line 3" in str(info.value)


def test_from_file_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        ScriptedTransport.from_file(tmp_path / "absent.json")


def test_validation_error_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "demo.json"
    path.write_text('{"turns": [{"texts": "typo"}]}', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"demo\.json: turns\[0\]: a turn is an object"):
        ScriptedTransport.from_file(path)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (
            {"turns": [{"text": "a"}, {}, {}, {"tool_calls": [{"arguments": {}}]}]},
            "turns[1]: a turn is an object with exactly one of",
        ),
        (
            {"turns": [{"text": "a"}, {"text": "b"}, {"text": "c"}, {"tool_calls": [{}]}]},
            'turns[3].tool_calls[0]: missing "name"',
        ),
        ({"turns": [{"text": "a", "empty": True}]}, "turns[0]: a turn is an object"),
        ({"turns": ["just text"]}, "turns[0]: a turn is an object"),
        ({"turns": [{"repeat": 0, "turn": {"text": "a"}}]}, "turns[0].repeat: "),
        ({"turns": [{"repeat": 2}]}, 'turns[0]: missing "turn"'),
        (
            {"turns": [{"repeat": 2, "turn": {"repeat": 2, "turn": {"bogus": 1}}}]},
            "turns[0].turn.turn: a turn is an object",
        ),
        ({"turns": [{"error": {"status": "429"}}]}, "turns[0].error.status: "),
        ({"turns": [{"error": {"status": 429.0}}]}, "turns[0].error.status: "),
        ({"turns": [{"error": {"status": True}}]}, "turns[0].error.status: "),
        ({"turns": [{"error": {"status": 200}}]}, "turns[0].error.status: "),
        ({"turns": [{"error": "429"}]}, "turns[0].error: expected an object"),
        ({"turns": [{"empty": False}]}, "turns[0].empty: "),
        ({"turns": [{"text": 3}]}, "turns[0].text: "),
        ({"turns": [{"text": "a", "note": 1}]}, 'turns[0]: unknown key "note"'),
        ({"turns": [{"tool_calls": [{"name": ""}]}]}, "turns[0].tool_calls[0].name: "),
        (
            {"turns": [{"tool_calls": [{"name": "t", "arguments": [1]}]}]},
            "turns[0].tool_calls[0].arguments: arguments must be an object",
        ),
        (
            {"turns": [{"tool_calls": [{"name": "t", "arguments": {"a": {1, 2}}}]}]},
            "turns[0].tool_calls[0].arguments: arguments are not JSON",
        ),
        ({"turn": []}, '(top level): missing "turns"'),
        ([{"text": "a"}], "(top level): expected an object"),
        ({"turns": [], "latency_ms": -5}, "latency_ms: "),
        ({"turns": [], "on_synthesis": {"repeat": 2, "turn": {"text": "a"}}}, "on_synthesis: "),
        ({"turns": [], "on_synthesis": {"nope": 1}}, "on_synthesis: a turn is an object"),
    ],
)
def test_validation_errors_name_the_json_path(data: Any, expected: str) -> None:
    message = config_error(data)
    assert message.startswith("script demo.json: ")
    assert expected in message


def test_repeat_cannot_expand_without_bound() -> None:
    deep = {"repeat": 1000, "turn": {"repeat": 1000, "turn": {"text": "a"}}}
    assert "turns[0]: the script expands past" in config_error({"turns": [deep]})
    huge = {"repeat": 10**12, "turn": {"text": "a"}}
    assert "expands past" in config_error({"turns": [huge]})
    many = {"repeat": 60_000, "turn": {"text": "a"}}
    assert "turns: the script expands past" in config_error({"turns": [many, many]})


def test_every_problem_is_listed() -> None:
    message = config_error({"turns": [{"tool_calls": [{}]}, {"error": {"status": "x"}}]})
    assert 'turns[0].tool_calls[0]: missing "name"' in message
    assert "turns[1].error.status: " in message
