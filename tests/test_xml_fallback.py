"""The XML fallback: the tolerant call parser, the text-only request, and the transport shell."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import keel
from keel.errors import ProviderError
from keel.messages import (
    AssistantMessage,
    Item,
    ModelRequest,
    ModelResponse,
    ToolCall,
    ToolDefinition,
    ToolResult,
    Usage,
    UserMessage,
)
from keel.tools.executor import ToolExecutor
from keel.transports.base import Transport
from keel.transports.xml_fallback import (
    TOOL_INSTRUCTION,
    XmlFallbackTransport,
    call_block,
    from_text_response,
    result_block,
    to_text_request,
    tool_prompt,
)
from keel.transports.xml_parse import UNNAMED_CALL, parse_calls

FETCH = ToolDefinition(
    "fetch",
    "Download a web page as text.",
    {"type": "object", "properties": {"url": {"type": "string"}}, "required": ["url"]},
)


def calls_of(text: str) -> list[tuple[str, Any]]:
    return [(c.name, c.arguments) for c in parse_calls(text).calls]


def result(call_id: str, content: str, *, name: str = "fetch", error: bool = False) -> ToolResult:
    return ToolResult(call_id, name, f"{name} {{}}", content, is_error=error)


# -- parsing: the well-formed cases -------------------------------------------------------------


def test_prose_around_and_between_several_calls() -> None:
    parsed = parse_calls(
        "First the page.\n"
        '<call name="fetch">{"url": "https://example.org/a"}</call>\n'
        "Then the readme.\n"
        '<call name="read_file">{"path": "README.md"}</call>\n'
        "That is all."
    )
    assert [(c.id, c.name, c.arguments) for c in parsed.calls] == [
        ("xml_1", "fetch", {"url": "https://example.org/a"}),
        ("xml_2", "read_file", {"path": "README.md"}),
    ]
    assert parsed.text_without_calls == "First the page.\n\nThen the readme.\n\nThat is all."
    assert parsed.calls[0].key == 'fetch {"url":"https://example.org/a"}'


def test_text_without_blocks_is_returned_unchanged() -> None:
    text = "  The loop depends on the breaker.\n"
    assert parse_calls(text).text_without_calls == text
    assert parse_calls(text).calls == []


def test_only_calls_leave_no_text() -> None:
    assert parse_calls('<call name="fetch">{"url": "a"}</call>').text_without_calls == ""


def test_a_code_fence_around_the_blocks_is_removed_with_them() -> None:
    parsed = parse_calls(
        "Calling:\n```xml\n"
        '<call name="fetch">{"url": "a"}</call>\n'
        '<call name="fetch">{"url": "b"}</call>\n'
        "```\nDone."
    )
    assert [c.arguments for c in parsed.calls] == [{"url": "a"}, {"url": "b"}]
    assert parsed.text_without_calls == "Calling:\n\nDone."


def test_an_unrelated_code_block_in_the_prose_is_kept() -> None:
    parsed = parse_calls('```python\nx = 1\n```\n<call name="fetch">{"url": "a"}</call>')
    assert parsed.text_without_calls == "```python\nx = 1\n```"
    assert len(parsed.calls) == 1


def test_a_fence_inside_the_block_around_the_json() -> None:
    text = '<call name="fetch">\n```json\n{"url": "a"}\n```\n</call>'
    assert calls_of(text) == [("fetch", {"url": "a"})]


@pytest.mark.parametrize(
    "opening",
    [
        '<call name="fetch">',
        "<call name='fetch'>",
        "<call name=fetch>",
        '<call  name = "fetch" >',
        '<CALL NAME="fetch">',
        '<call tool="fetch">',
        '<call id="1" name="fetch">',
    ],
)
def test_attribute_spellings(opening: str) -> None:
    assert calls_of(f'{opening} {{"url": "a"}} </call >') == [("fetch", {"url": "a"})]


def test_escaped_quotes_and_a_closing_tag_inside_json_strings() -> None:
    text = r'<call name="note">{"text": "she said \"</call>\" and <call name=x>"}</call> after'
    parsed = parse_calls(text)
    assert [(c.name, c.arguments) for c in parsed.calls] == [
        ("note", {"text": 'she said "</call>" and <call name=x>'})
    ]
    assert parsed.text_without_calls == "after"


def test_a_self_closing_block_is_a_call_without_arguments() -> None:
    assert calls_of('<call name="list_tools"/>') == [("list_tools", {})]


def test_a_mention_of_the_tag_in_prose_is_not_a_call() -> None:
    text = "Write a <call> block to use a tool."
    assert parse_calls(text).calls == []
    assert parse_calls(text).text_without_calls == text


def test_the_name_may_come_from_the_json_body() -> None:
    text = '<call>{"name": "fetch", "arguments": {"url": "a"}}</call>'
    assert calls_of(text) == [("fetch", {"url": "a"})]
    encoded_twice = '<call>{"name": "fetch", "arguments": "{\\"url\\": \\"a\\"}"}</call>'
    assert calls_of(encoded_twice) == [("fetch", {"url": "a"})]


def test_ids_come_from_the_given_factory() -> None:
    ids = iter(["xml_41", "xml_42"])
    parsed = parse_calls("<call name=a>{}</call><call name=b>{}</call>", lambda: next(ids))
    assert [c.id for c in parsed.calls] == ["xml_41", "xml_42"]


# -- parsing: what small models get wrong ---------------------------------------------------


def test_malformed_json_stays_invalid_and_keeps_its_text() -> None:
    (call,) = parse_calls('<call name="fetch">{"url": "a",}</call>').calls
    assert call.name == "fetch"
    assert call.raw_arguments == '{"url": "a",}'
    assert call.arguments is None
    assert call.parse_error is not None
    assert call.key == 'fetch !{"url": "a",}'


def test_junk_after_the_json_makes_the_block_invalid() -> None:
    (call,) = parse_calls('<call name="fetch">{"url": "a"} please</call>').calls
    assert call.raw_arguments == '{"url": "a"} please'
    assert call.parse_error is not None


def test_a_missing_name_becomes_a_call_no_tool_answers() -> None:
    (call,) = parse_calls('<call>{"url": "a"}</call>').calls
    assert call.name == UNNAMED_CALL
    assert call.arguments == {"url": "a"}
    (call,) = parse_calls('<call name="">{"url": "a"}</call>').calls
    assert call.name == UNNAMED_CALL


def test_an_unclosed_final_block_is_recovered() -> None:
    parsed = parse_calls('Fetching.\n<call name="fetch">{"url": "a"}\n')
    assert [(c.name, c.arguments) for c in parsed.calls] == [("fetch", {"url": "a"})]
    assert parsed.text_without_calls == "Fetching."


def test_an_unclosed_block_followed_by_another_block() -> None:
    text = '<call name="a">{"x": 1}\n<call name="b">{"y": 2}</call>'
    assert calls_of(text) == [("a", {"x": 1}), ("b", {"y": 2})]


def test_an_unclosed_block_inside_a_closed_fence() -> None:
    parsed = parse_calls('```xml\n<call name="a">{"x": 1}\n```')
    assert [(c.name, c.arguments) for c in parsed.calls] == [("a", {"x": 1})]
    assert parsed.text_without_calls == ""


def test_cut_off_json_becomes_an_invalid_call_not_a_lost_one() -> None:
    (call,) = parse_calls('<call name="fetch">{"url": "https://exa').calls
    assert (call.name, call.raw_arguments) == ("fetch", '{"url": "https://exa')
    assert call.parse_error is not None


async def test_malformed_blocks_become_error_results_through_the_real_executor() -> None:
    @keel.tool
    def fetch(url: str) -> str:
        """Download a page."""
        return f"page at {url}"

    parsed = parse_calls(
        '<call name="fetch">{"url": "a",}</call>\n'
        '<call>{"url": "b"}</call>\n'
        '<call name="fetch">{"url": "c"}</call>'
    )
    executed = await ToolExecutor([fetch]).run_batch(parsed.calls)
    bad_json, unnamed, good = (e.result for e in executed)
    assert bad_json.is_error and "could not be read" in bad_json.content
    assert unnamed.is_error and "no tool named 'invalid_call'" in unnamed.content
    assert "Available tools: fetch" in unnamed.content
    assert (good.is_error, good.content) == (False, "page at c")


# -- parsing: adversarial text ------------------------------------------------------------------

FRAGMENTS = [
    "<call",
    "<call ",
    "name=",
    'name="',
    "name='",
    '">',
    "'>",
    ">",
    "/>",
    "{",
    "}",
    "[",
    "]",
    '"',
    "\\",
    ":",
    ",",
    "</call>",
    "</ call >",
    "</call",
    "```",
    "```xml\n",
    "```json\n",
    "\n",
    " ",
    "fetch",
    '"url"',
    '"a"',
    "1",
    "null",
    "NaN",
    "tool=",
    "<CALL",
    "&quot;",
    "<result>",
]


def _check_never_breaks(text: str) -> None:
    parsed = parse_calls(text)
    assert isinstance(parsed.text_without_calls, str)
    assert len({c.id for c in parsed.calls}) == len(parsed.calls)
    for call in parsed.calls:
        assert isinstance(call, ToolCall)
        assert call.name
        assert isinstance(call.key, str) and call.key.startswith(call.name + " ")
        assert call.parse_error is None or call.arguments is None


@given(st.text())
def test_any_text_parses_without_raising(text: str) -> None:
    _check_never_breaks(text)


@settings(max_examples=400)
@given(st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=3), max_size=40).map("".join))
def test_call_shaped_fragments_parse_without_raising(text: str) -> None:
    _check_never_breaks(text)


@keel.tool
def lookup(term: str) -> str:
    """Look a term up."""
    return f"{term}: found"


@settings(max_examples=150)
@given(st.lists(st.sampled_from([*FRAGMENTS, "lookup", '"term"']), max_size=30).map("".join))
def test_the_executor_answers_every_call_parsed_from_junk(text: str) -> None:
    calls = parse_calls(text).calls
    executed = asyncio.run(ToolExecutor([lookup]).run_batch(calls))
    assert [e.result.call_id for e in executed] == [c.id for c in calls]
    for call, done in zip(calls, executed, strict=True):
        assert done.result.is_error or call.name == "lookup"
        assert done.result.is_error or done.result.content.endswith(": found")


def test_deeply_nested_arguments_do_not_raise() -> None:
    _check_never_breaks('<call name="a">' + "[" * 100_000 + "</call>")
    _check_never_breaks('<call name="a">{"x":' + "[" * 100_000)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)


@given(
    st.text(min_size=1).filter(lambda s: s.strip() == s and s != ""),
    st.dictionaries(st.text(), JSON_VALUES, max_size=4),
)
def test_a_replayed_call_block_parses_back_to_the_same_call(
    name: str, args: dict[str, Any]
) -> None:
    call = ToolCall.from_arguments("c1", name, args)
    for raw in (call.raw_arguments, json.dumps(args, ensure_ascii=False)):
        block = call_block(ToolCall.from_raw("c1", name, raw))
        (back,) = parse_calls(f"Prose.\n{block}\nMore.").calls
        assert (back.name, back.key) == (name, call.key)


# -- the text-only request --------------------------------------------------------------------

CALL_1 = ToolCall.from_raw("call_1", "fetch", '{"url": "https://example.org/a"}')
CALL_2 = ToolCall.from_raw("call_2", "fetch", '{"url": "https://example.org/b"}')
HISTORY: tuple[Item, ...] = (
    UserMessage("What does the page say?"),
    AssistantMessage("Looking.", (CALL_1, CALL_2), {"reasoning": "r1"}),
    result("call_1", "Page A"),
    result("call_2", "404 Not Found", error=True),
    AssistantMessage(None, (ToolCall.from_raw("call_3", "fetch", '{"url": "c"}'),)),
    result("call_3", "Page C"),
    AssistantMessage("Done."),
)


def test_an_ordinary_turn_describes_the_tools_in_the_system_text() -> None:
    sent = to_text_request(
        ModelRequest("Be careful.", (FETCH,), HISTORY, volatile=("v1",), estimated_input_tokens=9)
    )
    assert sent.system == "Be careful.\n\n" + tool_prompt((FETCH,))
    assert sent.system.index(TOOL_INSTRUCTION) > 0
    assert "- fetch: Download a web page as text." in sent.system
    assert json.dumps(FETCH.parameters) in sent.system
    assert (sent.tools, sent.tool_choice) == ((), None)
    assert (sent.volatile, sent.estimated_input_tokens) == (("v1",), 9)


def test_the_instruction_shows_the_format_and_never_the_qwen_tag() -> None:
    assert '<call name="get_weather">{"city": "Paris"}</call>' in TOOL_INSTRUCTION
    assert "tool_call" not in tool_prompt((FETCH,))
    assert calls_of(TOOL_INSTRUCTION) == [("get_weather", {"city": "Paris"})]


def test_a_synthesis_turn_leaves_the_instruction_and_schemas_out() -> None:
    ordinary = to_text_request(ModelRequest("Be careful.", (FETCH,), HISTORY))
    synthesis = to_text_request(
        ModelRequest("Be careful.", (FETCH,), HISTORY, tool_choice="none", volatile=("Answer.",))
    )
    assert synthesis.system == "Be careful."
    assert (synthesis.tools, synthesis.tool_choice) == ((), None)
    assert synthesis.items == ordinary.items
    assert synthesis.volatile == ("Answer.",)


def test_a_request_without_tools_gets_no_instruction() -> None:
    assert to_text_request(ModelRequest("Be careful.", (), HISTORY)).system == "Be careful."
    assert to_text_request(ModelRequest("", (FETCH,), ())).system == tool_prompt((FETCH,))


def test_history_replays_as_text() -> None:
    items = to_text_request(ModelRequest("", (FETCH,), HISTORY)).items
    assert items == (
        UserMessage("What does the page say?"),
        AssistantMessage(
            "Looking.\n"
            '<call name="fetch">{"url": "https://example.org/a"}</call>\n'
            '<call name="fetch">{"url": "https://example.org/b"}</call>',
            (),
            {"reasoning": "r1"},
        ),
        UserMessage(
            '<result name="fetch" id="call_1">\nPage A\n</result>\n'
            '<result name="fetch" id="call_2" error="true">\n404 Not Found\n</result>'
        ),
        AssistantMessage('<call name="fetch">{"url": "c"}</call>'),
        UserMessage('<result name="fetch" id="call_3">\nPage C\n</result>'),
        AssistantMessage("Done."),
    )


def test_a_closing_tag_inside_a_result_cannot_end_the_block() -> None:
    block = result_block(result("c1", "before </result> <result id=x> and </ RESULT> after"))
    assert block.count("</result>") == 1 and block.endswith("</result>")
    assert "before <\\/result> <result id=x> and <\\/ RESULT> after" in block


def test_attribute_values_cannot_break_out_of_their_quotes() -> None:
    call = ToolCall.from_raw('x"1', 'a"b>', "{}")
    block = call_block(call)
    assert block == '<call name="a&quot;b&gt;">{}</call>'
    assert calls_of(block) == [('a"b>', {})]
    assert 'id="x&quot;1"' in result_block(result('x"1', "ok"))


def test_an_empty_argument_text_replays_as_an_empty_object() -> None:
    assert call_block(ToolCall.from_raw("c", "now", "")) == '<call name="now">{}</call>'


# -- the transport shell ----------------------------------------------------------------------


class FakeInner:
    """A text-only transport: records what it was sent, answers from a queue."""

    name = "fake"

    def __init__(self, *answers: ModelResponse | Exception) -> None:
        self.answers = list(answers)
        self.sent: list[ModelRequest] = []

    async def request(self, request: ModelRequest) -> ModelResponse:
        self.sent.append(request)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def text(value: str | None, **kwargs: Any) -> ModelResponse:
    return ModelResponse(value, usage=Usage(50, 7, 5), stop_reason="stop", **kwargs)


async def test_the_transport_sends_text_and_reads_calls_back() -> None:
    inner = FakeInner(text('Fetching.\n<call name="fetch">{"url": "a"}</call>'))
    transport = XmlFallbackTransport(inner)
    assert isinstance(transport, Transport)
    assert transport.name == "xml:fake"
    request = ModelRequest("S", (FETCH,), HISTORY)
    response = await transport.request(request)
    assert inner.sent == [to_text_request(request)]
    assert response.text == "Fetching."
    assert [(c.id, c.name, c.arguments) for c in response.tool_calls] == [
        ("xml_1", "fetch", {"url": "a"})
    ]
    assert (response.usage, response.stop_reason) == (Usage(50, 7, 5), "stop")


async def test_ids_are_unique_across_calls_and_past_a_replayed_history() -> None:
    two = '<call name="fetch">{"url": "a"}</call><call name="fetch">{"url": "b"}</call>'
    inner = FakeInner(text(two), text(two), text(two))
    transport = XmlFallbackTransport(inner)
    first = await transport.request(ModelRequest("", (FETCH,), ()))
    second = await transport.request(ModelRequest("", (FETCH,), ()))
    assert [c.id for c in (*first.tool_calls, *second.tool_calls)] == [
        "xml_1",
        "xml_2",
        "xml_3",
        "xml_4",
    ]
    assert first.text is None
    resumed = (AssistantMessage(None, (ToolCall.from_raw("xml_17", "fetch", "{}"),)),)
    third = await transport.request(ModelRequest("", (FETCH,), resumed))
    assert [c.id for c in third.tool_calls] == ["xml_18", "xml_19"]


async def test_a_plain_answer_passes_through_untouched() -> None:
    answer = text("The loop depends on the breaker.", provider_details={"id": "r1"})
    response = await XmlFallbackTransport(FakeInner(answer)).request(
        ModelRequest("", (FETCH,), (), tool_choice="none")
    )
    assert response is answer


async def test_calls_written_in_a_synthesis_turn_still_reach_the_runtime() -> None:
    inner = FakeInner(text('<call name="fetch">{"url": "a"}</call>'))
    response = await XmlFallbackTransport(inner).request(
        ModelRequest("", (FETCH,), (), tool_choice="none")
    )
    assert [c.name for c in response.tool_calls] == ["fetch"]  # so the loop can refuse them


async def test_provider_errors_propagate_unchanged() -> None:
    error = ProviderError("simulated failure 429", status=429, retryable=True, retry_after=7)
    with pytest.raises(ProviderError) as info:
        await XmlFallbackTransport(FakeInner(error)).request(ModelRequest("", (FETCH,), ()))
    assert info.value is error


def test_from_text_response_keeps_native_calls_first() -> None:
    native = ToolCall.from_raw("call_n", "fetch", "{}")
    response = from_text_response(
        ModelResponse('<call name="fetch">{"url": "a"}</call>', (native,)), lambda: "xml_9"
    )
    assert [c.id for c in response.tool_calls] == ["call_n", "xml_9"]


def test_qwen_native_tool_call_spelling_is_accepted() -> None:
    text = (
        'Reading it.\n<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}'
        "\n</tool_call>"
    )
    parsed = parse_calls(text)
    assert parsed.text_without_calls == "Reading it."
    (call,) = parsed.calls
    assert (call.name, call.arguments) == ("read_file", {"path": "a.py"})


def test_the_text_request_keeps_the_cache_key_and_counts_only_wholly_settled_messages() -> None:
    first, second = ToolCall.from_raw("c1", "fetch", "{}"), ToolCall.from_raw("c2", "fetch", "{}")
    items: tuple[Item, ...] = (
        UserMessage("q"),
        AssistantMessage(None, (first, second)),
        result("c1", "[elided to save context]"),
        result("c2", "page two"),
        AssistantMessage("Done?"),
    )
    # results c1 and c2 become one user message: settled up to c1 leaves it unsettled
    text = to_text_request(ModelRequest("s", (FETCH,), items, settled_items=3, cache_key="run_1"))
    assert [i.kind for i in text.items] == ["user", "assistant", "user", "assistant"]
    assert text.settled_items == 2 and text.cache_key == "run_1"
    whole = to_text_request(ModelRequest("s", (FETCH,), items, settled_items=4))
    assert whole.settled_items == 3
