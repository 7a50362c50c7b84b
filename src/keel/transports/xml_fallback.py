"""Tool use for any text-only chat model: the tools are described in words, calls come back as text.

`XmlFallbackTransport` wraps another transport (Chat Completions against a small local model, a
server without native tool calling) and never sends it a tool. Instead:

* the system text gains `TOOL_INSTRUCTION` and the tools' JSON Schemas, so the model knows to
  write ``<call name="TOOL">{...}</call>``. The tag is deliberately not ``<tool_call>``: Qwen
  models emit that as a special token, which servers strip from the text;
* prior calls and results replay as text: an assistant turn's calls become the very blocks the
  model was told to write, and each run of results becomes one user message of
  ``<result name=".." id="..">`` blocks;
* the inner transport's answer is parsed by `keel.transports.xml_parse.parse_calls`, which turns
  every block, even a broken one, into a `ToolCall` the executor can answer.

Structured output (keel/structured.py) is asked for in words too: a request with
`ModelRequest.output` gets `output_instruction` (the answer's JSON Schema, and "reply with only
the JSON") as its last volatile control, and the inner transport is sent no schema, so the
model stays free to write call blocks; the run parses and validates the answer it writes.

In a synthesis turn (``tool_choice="none"``, ADR 0002) the instruction and schemas are left out, so
nothing invites a call; the history still replays as text. The mapping both ways is pure
(`to_text_request`, `from_text_response`); the transport is a thin shell around the inner one, and
a `ProviderError` from it passes through unchanged.

The wrapper offers exactly the capabilities of the transport it wraps (`keel.transports.base`):
over a `Resumable` transport it is Resumable (``xml:script:FILE`` pauses and resumes at the right
turn), over a `LocalModel` it is a LocalModel (``local`` lends the run its tokenizer), over a
transport that steers its model's first call (`SteersFirstCall`) it steers it alike, and over
anything else it claims none of them. Over any transport it offers a token counter (`CountsTokens`):
the inner model's own, or an estimate calibrated for the text it sends.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Callable, Collection, Iterable
from typing import Any, cast

from keel.messages import (
    AssistantMessage,
    Item,
    ModelRequest,
    ModelResponse,
    OutputSchema,
    ToolCall,
    ToolDefinition,
    ToolResult,
    UserMessage,
)
from keel.tokens import CalibratedCounter, TokenCounter
from keel.transports.base import Keyed, LocalModel, Priced, Resumable, SteersFirstCall, Transport
from keel.transports.xml_parse import UNNAMED_CALL, ParsedText, parse_calls

__all__ = [
    "TOOL_INSTRUCTION",
    "UNNAMED_CALL",
    "ParsedText",
    "XmlFallbackTransport",
    "call_block",
    "from_text_response",
    "output_instruction",
    "parse_calls",
    "result_block",
    "to_text_request",
    "tool_prompt",
]

TOOL_INSTRUCTION = """\
# Tools

You can use the tools listed below. To call a tool, write a call block: the tool's name in \
the name attribute, and its arguments inside as one JSON object. For example:

<call name="get_weather">{"city": "Paris"}</call>

Write one block for each call; you may write several. Then stop: the results come back to you \
in <result> blocks. When you can answer, write the answer as plain text with no call block.

## Available tools
"""
"""Kept short and fixed (byte-identical every turn) so even a 0.5B model can follow it."""

_CALL_CLOSE = re.compile(r"<(?=\s*/\s*call\b)", re.IGNORECASE)
_RESULT_CLOSE = re.compile(r"<(?=\s*/\s*result\b)", re.IGNORECASE)
_XML_ID = re.compile(r"xml_(\d{1,18})")


def tool_prompt(tools: Iterable[ToolDefinition]) -> str:
    """The instruction followed by each tool's name, description and argument schema."""
    parts = [TOOL_INSTRUCTION]
    for tool in tools:
        schema = json.dumps(tool.parameters, ensure_ascii=False)
        parts.append(f"- {tool.name}: {tool.description}\n  Arguments (JSON Schema): {schema}\n")
    return "\n".join(parts).rstrip() + "\n"


def call_block(call: ToolCall) -> str:
    """A call exactly as the model is told to write it.

    Inside JSON strings ``</`` may be written ``<\\/`` with the same meaning, so arguments that
    mention ``</call>`` cannot end the block early.
    """
    arguments = _CALL_CLOSE.sub(r"<\\", call.raw_arguments.strip() or "{}")
    return f'<call name="{_attribute(call.name)}">{arguments}</call>'


def result_block(result: ToolResult) -> str:
    """A result as the model reads it: the text as is, except that a closing ``</result>`` in it
    is written ``<\\/result>`` so it cannot end the block early."""
    error = ' error="true"' if result.is_error else ""
    content = _RESULT_CLOSE.sub(r"<\\", result.content)
    return (
        f'<result name="{_attribute(result.name)}" id="{_attribute(result.call_id)}"{error}>\n'
        f"{content}\n</result>"
    )


def to_text_request(request: ModelRequest) -> ModelRequest:
    """The tool-less request for the inner transport (pure).

    Ordinary turns with tools get the instruction and schemas after the system text; synthesis
    turns (tool_choice "none") and tool-less requests do not. Volatile controls pass unchanged,
    followed by the output schema's instruction when the request has one.
    """
    system = request.system
    if request.tools and request.tool_choice != "none":
        system = "\n\n".join(part for part in (system, tool_prompt(request.tools)) if part)
    volatile = request.volatile
    if request.output is not None:
        volatile += (output_instruction(request.output),)
    return ModelRequest(
        system=system,
        tools=(),
        items=tuple(_replay(request.items)),
        tool_choice=None,
        volatile=volatile,
        estimated_input_tokens=request.estimated_input_tokens,
        settled_items=_settled(request.items, request.settled_items),
        cache_key=request.cache_key,
    )


def output_instruction(output: OutputSchema) -> str:
    """How the final answer must be written when the run asked for structured output."""
    schema = json.dumps(output.schema, ensure_ascii=False, sort_keys=True)
    return (
        "When you give your final answer (instead of a call), reply with only a JSON value, "
        f"no prose and no code fence, that matches this JSON Schema ({output.name}): {schema}"
    )


def _settled(items: tuple[Item, ...], settled: int) -> int:
    """How many replayed items come wholly from the first `settled` items: a run of results
    that crosses the boundary becomes one message, which is not settled."""
    count = sum(1 for _ in _replay(items[:settled]))
    crosses = 0 < settled < len(items)
    if (
        crosses
        and isinstance(items[settled - 1], ToolResult)
        and isinstance(items[settled], ToolResult)
    ):
        count -= 1
    return count


def from_text_response(response: ModelResponse, new_id: Callable[[], str]) -> ModelResponse:
    """The inner answer with its call blocks read out (pure apart from `new_id`).

    Text outside the blocks stays the answer's text (None when there is only calls); usage, stop
    reason and provider details pass through.
    """
    parsed = parse_calls(response.text or "", new_id)
    if not parsed.calls:
        return response
    return ModelResponse(
        text=parsed.text_without_calls or None,
        tool_calls=(*response.tool_calls, *parsed.calls),
        usage=response.usage,
        stop_reason=response.stop_reason,
        provider_details=response.provider_details,
        response_id=response.response_id,
        model=response.model,
    )


class XmlFallbackTransport:
    """Tools over any text-capable transport; see the module docstring.

    Constructing one picks the subclass that forwards the capabilities `inner` has, so
    ``isinstance(XmlFallbackTransport(inner), Resumable)`` answers for `inner`.
    """

    def __new__(cls, inner: Transport) -> XmlFallbackTransport:
        if cls is XmlFallbackTransport:
            cls = _forwarding(inner)
        return super().__new__(cls)

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.name = f"xml:{inner.name}"
        self._issued = 0
        """The highest ``xml_<n>`` id given out (or seen in a replayed history)."""

    async def request(self, request: ModelRequest) -> ModelResponse:
        # A resumed run replays ids an earlier instance gave out: never give them out again.
        self._issued = max(self._issued, _highest_xml_id(request.items))
        response = await self.inner.request(to_text_request(request))
        return from_text_response(response, self._new_id)

    def secret(self) -> str | None:
        """The key of the transport it wraps (`keel.transports.base.Keyed`)."""
        return self.inner.secret() if isinstance(self.inner, Keyed) else None

    def priced_as(self) -> str:
        """Priced as the transport it wraps (`keel.transports.base.Priced`)."""
        inner = self.inner
        return f"xml:{inner.priced_as() if isinstance(inner, Priced) else inner.name}"

    def _new_id(self) -> str:
        self._issued += 1
        return f"xml_{self._issued}"

    def token_counter(self) -> TokenCounter:
        """The estimate calibrated on Qwen2.5's tokenizer (`keel.tokens.CalibratedCounter`):
        tools, calls and results all travel as text here, and text full of digits and
        punctuation costs far more tokens than its bytes say (ADR 0035). Over a local model,
        that model's own tokenizer instead (`_LocalXml`)."""
        return CalibratedCounter()


class _ResumableXml(XmlFallbackTransport, Resumable):
    """Over a Resumable transport. The wrapper's own state, the highest ``xml_<n>`` id given
    out, is rebuilt from the replayed history, so the inner snapshot is the whole snapshot."""

    def snapshot(self) -> dict[str, Any]:
        return cast(Resumable, self.inner).snapshot()

    def restore(self, state: dict[str, Any]) -> None:
        cast(Resumable, self.inner).restore(state)


class _LocalXml(XmlFallbackTransport, LocalModel):
    """Over a LocalModel transport: the tokenizer and window are the inner model's. (The
    instruction and schemas the wrapper adds are within the agent's `WINDOW_MARGIN`.)"""

    @property
    def input_token_limit(self) -> int:
        return cast(LocalModel, self.inner).input_token_limit

    def token_counter(self) -> TokenCounter:
        return cast(LocalModel, self.inner).token_counter()


class _SteeringXml(XmlFallbackTransport, SteersFirstCall):
    """Over a transport that steers its model's first call: the inner transport's call."""

    def first_call(self, question: str, tools: Collection[str]) -> str | None:
        return cast(SteersFirstCall, self.inner).first_call(question, tools)


_CAPABILITIES: tuple[tuple[type[Any], type[XmlFallbackTransport]], ...] = (
    (Resumable, _ResumableXml),
    (LocalModel, _LocalXml),
    (SteersFirstCall, _SteeringXml),
)
"""Each capability the wrapper forwards, and the class that forwards it."""
_FORWARDING: dict[tuple[bool, ...], type[XmlFallbackTransport]] = {
    (False,) * len(_CAPABILITIES): XmlFallbackTransport
}
"""The class to build, by which capabilities the inner transport has: made (once) from the
forwarding classes of those it has; every cast above holds because
`XmlFallbackTransport.__new__` picks from here."""


def _forwarding(inner: Transport) -> type[XmlFallbackTransport]:
    has = tuple(isinstance(inner, capability) for capability, _ in _CAPABILITIES)
    cls = _FORWARDING.get(has)
    if cls is None:
        pairs = zip(_CAPABILITIES, has, strict=True)
        bases = tuple(forwards for (_, forwards), yes in pairs if yes)
        name = "_" + "".join(b.__name__.strip("_").removesuffix("Xml") for b in bases) + "Xml"
        made = bases[0] if len(bases) == 1 else type(name, bases, {})
        cls = _FORWARDING[has] = cast(type[XmlFallbackTransport], made)
    return cls


def _replay(items: Iterable[Item]) -> Iterable[Item]:
    """History as plain text: calls as blocks, each run of results as one user message."""
    results: list[str] = []
    for item in items:
        if isinstance(item, ToolResult):
            results.append(result_block(item))
            continue
        if results:
            yield UserMessage("\n".join(results))
            results = []
        if isinstance(item, AssistantMessage) and item.tool_calls:
            parts = [item.text.strip()] if item.text and item.text.strip() else []
            parts.extend(call_block(call) for call in item.tool_calls)
            yield AssistantMessage("\n".join(parts), (), item.provider_details)
        else:
            yield item
    if results:
        yield UserMessage("\n".join(results))


def _highest_xml_id(items: Iterable[Item]) -> int:
    highest = 0
    for item in items:
        if isinstance(item, AssistantMessage):
            for call in item.tool_calls:
                match = _XML_ID.fullmatch(call.provider_call_id)
                if match:
                    highest = max(highest, int(match.group(1)))
    return highest


def _attribute(value: str) -> str:
    """An attribute value that cannot end its quotes; the parser unescapes it again."""
    return html.escape(value, quote=True)
