"""Grammar-constrained decoding on the embedded model (`keel.transports.local`: `grammar`,
`constrained`).

The grammar is checked with llama.cpp's own grammar engine on the real model's vocabulary, and
the model is made to "want" things with a logits processor that runs before the grammar:

- every call Keel would replay for a schema is accepted by that schema's grammar (so the
  grammar never forbids a valid call);
- whatever the model prefers (random biases over the whole vocabulary), a grammar-constrained
  call parses into a call to a declared tool whose arguments the tool itself validates;
- a synthesis turn cannot produce a tool call even when the model is pushed hard toward one.
"""

from __future__ import annotations

import ctypes
import json
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pydantic
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keel.errors import ConfigError
from keel.messages import ModelRequest, ToolCall, ToolDefinition, UserMessage
from keel.tools.base import Tool
from keel.transports.local import LocalTransport
from keel.transports.local.grammar import MAX_STRING, literal, turn_grammar
from keel.transports.local.qwen_format import call_text

SYSTEM = "You are a careful research agent. Use the tools."
QUESTION = "Look into it with a tool."
CALL_TOKEN = 151657  # <tool_call> in Qwen2.5's vocabulary
LESS_THAN = 27  # "<"


# --- schemas and valid arguments, generated together ------------------------------------------


class Inner(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    label: str


_text = st.text(max_size=24)
KINDS: dict[str, tuple[Any, st.SearchStrategy[Any]]] = {
    "str": (str, _text),
    "int": (int, st.integers(-(10**12), 10**12)),
    "float": (float, st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False)),
    "bool": (bool, st.booleans()),
    "choice": (Literal["alpha", "beta gamma"], st.sampled_from(["alpha", "beta gamma"])),
    "maybe_int": (int | None, st.one_of(st.none(), st.integers(-999, 999))),
    "list_str": (list[str], st.lists(_text, max_size=3)),
    "inner": (Inner, _text.map(lambda t: {"label": t})),
}


@dataclass
class Case:
    tool: Tool
    arguments: dict[str, Any]
    """Valid arguments, in the order the grammar writes them (required first)."""


@st.composite
def cases(draw: st.DrawFn) -> Case:
    names = draw(st.lists(st.sampled_from(["path", "query", "n", "flag", "mode", "x_y"]),
                          min_size=1, max_size=4, unique=True))  # fmt: skip
    fields: dict[str, Any] = {}
    required: dict[str, Any] = {}
    optional: dict[str, Any] = {}
    for name in names:
        kind, values = KINDS[draw(st.sampled_from(sorted(KINDS)))]
        value = draw(values)
        if draw(st.booleans()):
            fields[name] = (kind, ...)
            required[name] = value
        else:
            fields[name] = (kind, None if kind is not str else "")
            if draw(st.booleans()):
                optional[name] = value
    model = pydantic.create_model("Args", __config__=pydantic.ConfigDict(extra="forbid"), **fields)
    tool = Tool("probe", "A tool under test.", model, lambda **_: "ok")
    return Case(tool, {**required, **optional})


# --- llama.cpp's grammar engine as an acceptor ------------------------------------------------


def accepts(transport: LocalTransport, grammar: str, text: str) -> bool:
    """Whether `grammar` lets the model write exactly `text` and then end its turn."""
    import llama_cpp

    llama = transport._load()
    vocab = llama_cpp.llama_model_get_vocab(llama.model)
    sampler = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
    assert sampler, "the grammar does not parse"
    try:
        tokens = llama.tokenize(text.encode(), add_bos=False, special=True)
        for token in [*tokens, llama.token_eos()]:
            data = (llama_cpp.llama_token_data * 1)(llama_cpp.llama_token_data(token, 0.0, 0.0))
            array = llama_cpp.llama_token_data_array(data, 1, -1, False)
            llama_cpp.llama_sampler_apply(sampler, ctypes.byref(array))
            if not np.isfinite(data[0].logit):
                return False
            llama_cpp.llama_sampler_accept(sampler, token)
        return True
    finally:
        llama_cpp.llama_sampler_free(sampler)


def call_of(case: Case) -> str:
    return call_text(ToolCall.from_arguments("local_1", case.tool.name, case.arguments))


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=cases())
def test_the_grammar_accepts_every_valid_call(local_transport: LocalTransport, case: Case) -> None:
    case.tool.validate(case.arguments)  # the generated arguments really are valid
    grammar = turn_grammar([case.tool.definition()], "required")
    assert accepts(local_transport, grammar, call_of(case)), (case.tool.parameters, call_of(case))


def test_the_number_rule_takes_every_float_python_writes(local_transport: LocalTransport) -> None:
    """Hypothesis found 0.0005143097173617363: Python writes a float down to 1e-4 in fixed form
    with up to 17 significant digits, so up to 21 after the point; the rule allowed 17."""
    gauge = ToolDefinition(
        "gauge",
        "Record a reading.",
        {"type": "object", "properties": {"value": {"type": "number"}}, "required": ["value"],
         "additionalProperties": False},
    )  # fmt: skip
    grammar = turn_grammar([gauge], "required")
    for value in (0.0005143097173617363, 0.00012345678901234568, 1.2345678901234567e16, 1e-05):
        text = call_text(ToolCall.from_arguments("local_1", "gauge", {"value": value}))
        assert accepts(local_transport, grammar, text), text


def test_the_grammar_rejects_what_does_not_fit(local_transport: LocalTransport) -> None:
    fetch = ToolDefinition(
        "fetch",
        "Download a page.",
        {"type": "object", "properties": {"url": {"type": "string"}}, "required": ["url"],
         "additionalProperties": False},
    )  # fmt: skip
    auto, none = turn_grammar([fetch], None), turn_grammar([fetch], "none")
    good = '<tool_call>\n{"name": "fetch", "arguments": {"url": "https://a.example"}}\n</tool_call>'
    assert accepts(local_transport, auto, good)
    assert accepts(local_transport, auto, "The answer is 42.")
    for bad in (
        good.replace('"fetch"', '"write_file"'),  # an undeclared tool
        good.replace('"https://a.example"', "7"),  # a number for a string
        good.replace("}}\n", ', "extra": 1}}\n'),  # a property the schema does not have
        good.replace('{"url": "https://a.example"}', "{}"),  # a required property missing
        good.replace('"https://a.example"', '"' + "a" * (MAX_STRING + 1) + '"'),  # unbounded
        good + good,  # a second call in the turn
        good[: -len("</tool_call>")],  # a call that does not end
    ):
        assert not accepts(local_transport, auto, bad), bad
    assert not accepts(local_transport, none, good)  # a synthesis turn: no call at all
    bare = '{"name": "fetch", "arguments": {"url": "https://a.example"}}'
    assert accepts(local_transport, auto, bare)  # a call without its tags is still a call
    assert not accepts(local_transport, auto, bare.replace("fetch", "write_file"))
    assert not accepts(local_transport, none, bare)  # and never in a synthesis turn
    assert not accepts(local_transport, auto, f"```json\n{bare}\n```")  # nor a fenced one
    assert accepts(local_transport, none, "The best supported answer.")
    assert not accepts(local_transport, turn_grammar([fetch], "required"), "The answer.")


def test_required_without_tools_is_misuse() -> None:
    with pytest.raises(ConfigError, match="required"):
        turn_grammar([], "required")
    assert literal('a"b\\c\nd\x01') == '"a\\"b\\\\c\\nd\\x01"'


# --- the model under random preferences -------------------------------------------------------


def random_preferences(seed: int, scale: float = 8.0) -> Any:
    """A logits processor adding fresh noise at every step: the model "wants" arbitrary
    tokens, far from what its weights would write."""
    rng = np.random.default_rng(seed)

    def bias(input_ids: Any, scores: Any) -> Any:
        return scores + rng.normal(0.0, scale, size=scores.shape).astype(scores.dtype)

    return bias


@settings(max_examples=5, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=cases(), seed=st.integers(0, 2**32 - 1))
async def test_a_grammar_constrained_call_parses_into_a_declared_tool_with_valid_arguments(
    local_transport: LocalTransport, case: Case, seed: int
) -> None:
    other = Tool("list_files", "List a folder.", Inner, lambda **_: "ok")
    tools = {t.name: t for t in (case.tool, other)}
    local_transport.logits_processor = random_preferences(seed)
    try:
        response = await local_transport.request(
            ModelRequest(
                SYSTEM,
                tuple(t.definition() for t in tools.values()),
                (UserMessage(QUESTION),),
                tool_choice="required",
            )
        )
    finally:
        local_transport.logits_processor = None
    assert response.text is None and len(response.tool_calls) == 1, response
    call = response.tool_calls[0]
    assert call.parse_error is None, call
    assert call.name in tools
    tools[call.name].validate(call.arguments)  # raises ToolArgumentError if they do not fit
    assert response.stop_reason == "stop"


def wants_a_call(input_ids: Any, scores: Any) -> Any:
    """The model "wants" nothing more than to open a tool call."""
    scores[CALL_TOKEN] += 50.0
    scores[LESS_THAN] += 50.0
    return scores


async def test_a_synthesis_turn_on_the_local_transport_cannot_produce_a_tool_call(
    local_transport: LocalTransport,
) -> None:
    schema = {"type": "object", "properties": {"url": {"type": "string"}}, "required": ["url"]}
    fetch = ToolDefinition("fetch", "Download a page.", schema)
    request = ModelRequest(SYSTEM, (fetch,), (UserMessage(QUESTION),))
    local_transport.logits_processor = wants_a_call
    try:
        ordinary = await local_transport.request(request)
        synthesis = await local_transport.request(
            ModelRequest(SYSTEM, (fetch,), request.items, "none", ("Answer now, no tools.",))
        )
    finally:
        local_transport.logits_processor = None
    assert [c.name for c in ordinary.tool_calls] == ["fetch"]  # the push works where allowed
    assert synthesis.tool_calls == ()
    assert synthesis.text and not synthesis.text.lstrip().startswith("<")
    assert "<tool_call>" not in json.dumps(synthesis.text)[:20]
