"""The Anthropic Messages API's wire mapping, pure and tested offline (STYLE.md point 5):
`to_wire` turns a ModelRequest into the request body, `from_wire` and `map_usage` read the
response body. The transport around one call is `keel.transports.anthropic`.

Round-tripped vendor data: ``provider_details["anthropic_thinking"]`` holds the response's
``thinking`` / ``redacted_thinking`` blocks exactly as received (signatures included). The API
requires them back, unchanged and before the ``tool_use`` blocks, when a thinking turn that
called tools is replayed. A turn that used server tools (``web_search``, ``web_fetch``, declared
by the user: ADR 0067) keeps all its blocks in order under ``provider_details
["anthropic_content"]`` instead, and is sent back block for block
(`keel.transports.anthropic_server`).

Prompt caching: Anthropic caches nothing unless asked, at ``cache_control`` breakpoints (at most
four per request), each caching the prompt up to and including its block. Keel marks the last
tool definition and the system block (the frozen prefix, the same for every turn), the last
settled history item (`ModelRequest.settled_items`: nothing before it changes for the rest of
the run, so it still serves after the context builder elides the results that follow it) and the
last history item (the next request extends this one). The volatile controls come after every
breakpoint, so they are never cached or read from a cache. See ADR 0021.

Structured output (keel/structured.py): the Messages API takes no response schema, so a request
with `ModelRequest.output` declares one more tool, ``keel_answer``, whose input schema is the
answer's; the model answers by calling it, and its input comes back as the turn's text (the
answer tool ends the turn: other calls beside it are not run). In a synthesis turn (tool_choice
"none") tool_choice names that tool, so the model must answer, in the schema, and can call
nothing else.

Answers are untrusted: the body arrives bounded (`keel.transports.bounded`, which also carries
an injected ``httpx.AsyncClient`` across to the SDK's ``httpx2``), is decoded strictly and read
against its declared shape (`_Message`, `keel.transports.wire`); thinking blocks are kept whole
but must be JSON with finite numbers.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Annotated, Any

from pydantic import Discriminator, JsonValue, Tag

from keel.hosted import ANTHROPIC_CONTENT, HostedTool
from keel.messages import (
    AssistantMessage,
    Item,
    ModelRequest,
    ModelResponse,
    OutputSchema,
    ToolCall,
    ToolResult,
    Usage,
    wire_call_ids,
)
from keel.transports.anthropic_server import (
    OPAQUE_BLOCKS,
    SERVER_BLOCKS,
    hosted_tool,
    replayed_content,
    tool_use_block,
)
from keel.transports.base import ServerToolChoice
from keel.transports.wire import Opaque, Shape, TokenCount, parse

__all__ = [
    "ANSWER_TOOL",
    "CACHE_BREAKPOINT",
    "PROVIDER",
    "THINKING_KEY",
    "from_wire",
    "map_usage",
    "to_wire",
]

ANSWER_TOOL = "keel_answer"
"""The tool a structured answer is given through (see the module docstring)."""
PROVIDER = "anthropic"
"""How messages about this transport's answers begin."""
THINKING_KEY = "anthropic_thinking"
"""The `provider_details` key of the opaque thinking blocks a replayed turn must carry."""
CACHE_BREAKPOINT: dict[str, str] = {"type": "ephemeral"}
"""The ``cache_control`` value of a breakpoint (the default five-minute cache)."""

_TOOL_CHOICE = {"none": "none", "required": "any", "auto": "auto"}
"""Keel's tool choices in the Messages API's words."""
_Block = dict[str, Any]
_Turn = dict[str, Any]


# --- to the wire -----------------------------------------------------------------------------


def to_wire(
    request: ModelRequest,
    *,
    model: str,
    max_tokens: int,
    tool_choice: ServerToolChoice | None = None,
    hosted: Iterable[HostedTool] = (),
) -> dict[str, Any]:
    """The Messages API body for `request`: system apart, roles alternating, controls last,
    cache breakpoints on the frozen prefix and the history (see the module docstring).
    `tool_choice` is sent when the request asks for none itself; `hosted`: the server tools
    the user declared, after Keel's own (ADR 0067)."""
    marked = {request.settled_items - 1, len(request.items) - 1} - {-1}
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "messages": _messages(request.items, request.volatile, marked),
    }
    if request.system:
        body["system"] = [
            {"type": "text", "text": request.system, "cache_control": CACHE_BREAKPOINT}
        ]
    tools = [
        {"name": t.name, "description": t.description, "input_schema": t.parameters}
        for t in request.tools
    ]
    tools.extend(hosted_tool(tool) for tool in hosted)
    if request.output is not None:
        tools.append(_answer_tool(request.output))
    if tools:
        # Kept in synthesis turns too: the replayed tool_use blocks must name declared tools.
        body["tools"] = tools
        tools[-1]["cache_control"] = CACHE_BREAKPOINT
        # Without tools the model cannot call one anyway, so neither needs a key then.
        choice = request.tool_choice or tool_choice
        if request.tool_choice == "none" and request.output is not None:
            body["tool_choice"] = {"type": "tool", "name": ANSWER_TOOL}  # answer, in the schema
        elif choice is not None:
            body["tool_choice"] = {"type": _TOOL_CHOICE[choice]}
    return body


def _answer_tool(output: OutputSchema) -> dict[str, Any]:
    what = (
        "an object with the answer under output, as far as the evidence supports it, and "
        "the open gaps under gaps"
        if output.partial
        else "the answer itself"
    )
    return {
        "name": ANSWER_TOOL,
        "description": f"Give your final answer ({output.name}) by calling this tool: its "
        f"input is {what}, in the required schema. Call it only when you are done researching.",
        "input_schema": output.schema,
    }


def _messages(items: Iterable[Item], volatile: Iterable[str], marked: set[int]) -> list[_Turn]:
    """Turns in history order, the items at the `marked` indexes ending in a cache breakpoint.
    An assistant turn with nothing to send (no text, no calls) is left out: the API accepts no
    empty message, and the merge keeps the roles alternating."""
    items = tuple(items)
    ids = wire_call_ids(items)
    messages: list[_Turn] = []
    for index, item in enumerate(items):
        if isinstance(item, AssistantMessage):
            role, blocks = "assistant", _assistant_blocks(item, ids)
        elif isinstance(item, ToolResult):
            role, blocks = "user", [_tool_result_block(item, ids)]
        else:
            role, blocks = "user", [{"type": "text", "text": item.text}]
        if index in marked:
            _mark(blocks)
        _append(messages, role, blocks)
    for message in messages:
        if message["role"] == "user":
            # The API wants a turn's tool_result blocks before any text in the same message.
            message["content"].sort(key=lambda block: block["type"] != "tool_result")
    _append(messages, "user", [{"type": "text", "text": text} for text in volatile])
    return messages


def _mark(blocks: list[_Block]) -> None:
    """A breakpoint on the item's last block (thinking blocks cannot carry one; they come
    first, so an item with only those gets none)."""
    for block in reversed(blocks):
        if block["type"] not in OPAQUE_BLOCKS:
            block["cache_control"] = CACHE_BREAKPOINT
            return


def _append(messages: list[_Turn], role: str, blocks: list[_Block]) -> None:
    """Add `blocks` as a `role` turn, merged into the previous turn if it has the same role:
    the API rejects two user (or two assistant) messages in a row."""
    if not blocks:
        return
    if messages and messages[-1]["role"] == role:
        messages[-1]["content"].extend(blocks)
    else:
        messages.append({"role": role, "content": blocks})


def _assistant_blocks(message: AssistantMessage, ids: Mapping[str, str]) -> list[_Block]:
    content = message.provider_details.get(ANTHROPIC_CONTENT)
    if isinstance(content, list):
        return replayed_content(message, content, ids)
    blocks: list[_Block] = [dict(b) for b in message.provider_details.get(THINKING_KEY, ())]
    if message.text and message.text.strip():
        blocks.append({"type": "text", "text": message.text})
    blocks.extend(tool_use_block(call, ids[call.id]) for call in message.tool_calls)
    return blocks


def _tool_result_block(result: ToolResult, ids: Mapping[str, str]) -> _Block:
    block: _Block = {
        "type": "tool_result",
        "tool_use_id": ids.get(result.call_id, result.call_id),
        "content": result.content,
    }
    if result.is_error:
        block["is_error"] = True
    return block


# --- from the wire ---------------------------------------------------------------------------


def from_wire(data: Mapping[str, Any], *, structured: bool = False) -> ModelResponse:
    """A Messages API response body (a ``message`` object) as a ModelResponse. The body is read
    as `_Message` first, so a field of the wrong type is a ProviderError naming it.
    `structured`: the request declared the answer tool, whose call is the answer."""
    message = parse(_Message, data, PROVIDER)
    texts: list[str] = []
    calls: list[ToolCall] = []
    opaque: list[_Block] = []
    layout: list[_Block] = []
    """Every block in order, for a turn with server tools (`ANTHROPIC_CONTENT`)."""
    answer: str | None = None
    for block in message.content or ():
        if isinstance(block, _Text):
            texts.append(block.text or "")
            layout.append(_text_entry(block))
        elif isinstance(block, _ToolUse) and structured and block.name == ANSWER_TOOL:
            answer = json.dumps(block.input or {}, ensure_ascii=False)
        elif isinstance(block, _ToolUse):
            arguments = json.dumps(block.input or {}, ensure_ascii=False)
            calls.append(ToolCall.from_raw(block.id, block.name, arguments))
            layout.append({"type": "tool_use", "id": block.id})
        elif isinstance(block, Opaque):
            opaque.append(dict(block.raw))
            layout.append(dict(block.raw))
    if answer is not None:  # the answer tool ends the turn: its input is the answer
        texts, calls = [answer], []
    served = any(b["type"] in SERVER_BLOCKS for b in layout)
    details = {ANTHROPIC_CONTENT: layout} if served else {THINKING_KEY: opaque} if opaque else {}
    return ModelResponse(
        text="".join(texts) if texts else None,
        tool_calls=tuple(calls),
        usage=_usage(message.usage),
        stop_reason=message.stop_reason,
        provider_details=details,
        response_id=message.id,
        model=message.model,
    )


def _text_entry(block: _Text) -> _Block:
    entry: _Block = {"type": "text", "text": block.text or ""}
    if block.citations:  # a web search result's or a fetched page's place (encrypted index)
        entry["citations"] = [dict(c.raw) for c in block.citations]
    return entry


def map_usage(usage: Mapping[str, Any] | None) -> Usage:
    """Anthropic counts cache reads and writes apart from ``input_tokens``; Keel's input count
    is the whole prompt, so the three are summed. Missing or null fields count as 0."""
    return _usage(parse(_Usage, usage or {}, PROVIDER, "usage"))


def _usage(usage: _Usage | None) -> Usage:
    usage = usage or _Usage()
    read = usage.cache_read_input_tokens or 0
    created = usage.cache_creation_input_tokens or 0
    return Usage(
        input_tokens=(usage.input_tokens or 0) + read + created,
        output_tokens=usage.output_tokens or 0,
        cached_input_tokens=read,
    )


# --- the shape of an answer (what is read, and no more) --------------------------------------


def _block_kind(value: Any) -> str:
    kind = value.get("type") if isinstance(value, Mapping) else None
    if kind in ("text", "tool_use"):
        return f"~{kind}"
    return "~opaque" if kind in OPAQUE_BLOCKS or kind in SERVER_BLOCKS else "~other"


class _Other(Shape):
    """A block of a type Keel does not read: only checked to be an object."""


class _Text(Shape):
    text: str | None = None
    citations: list[Opaque] | None = None


class _ToolUse(Shape):
    id: str
    name: str
    input: JsonValue = None


_Content = Annotated[
    Annotated[_Text, Tag("~text")]
    | Annotated[_ToolUse, Tag("~tool_use")]
    | Annotated[Opaque, Tag("~opaque")]
    | Annotated[_Other, Tag("~other")],
    Discriminator(_block_kind),
]


class _Usage(Shape):
    input_tokens: TokenCount | None = None
    output_tokens: TokenCount | None = None
    cache_read_input_tokens: TokenCount | None = None
    cache_creation_input_tokens: TokenCount | None = None


class _Message(Shape):
    id: str | None = None
    model: str | None = None
    content: list[_Content] | None = None
    stop_reason: str | None = None
    usage: _Usage | None = None
