"""Anthropic's server tools (ADR 0067): ``web_search`` and ``web_fetch`` declared as the user
asked, a turn that used them sent back block for block, and a turn the server paused continued.

The API needs a turn's ``server_tool_use`` and ``*_tool_result`` blocks again, unchanged
(``encrypted_content`` and the citations' ``encrypted_index`` included), when the history is
sent on: the transport keeps the turn's blocks in order (`keel.hosted.ANTHROPIC_CONTENT`) and
`replayed_content` sends them as they came, Keel's own calls and text standing where theirs did.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from keel.hosted import HostedTool
from keel.messages import AssistantMessage, ModelResponse, ToolCall

__all__ = [
    "MAX_PAUSES",
    "OPAQUE_BLOCKS",
    "SERVER_BLOCKS",
    "continued",
    "hosted_tool",
    "replayed_content",
    "tool_use_block",
]

_Block = dict[str, Any]
OPAQUE_BLOCKS = frozenset({"thinking", "redacted_thinking"})
SERVER_BLOCKS = frozenset({"server_tool_use", "web_search_tool_result", "web_fetch_tool_result"})
"""Blocks of a server tool's call and result (ADR 0067): kept whole, sent back as received."""
_HOSTED_TYPES = {"web_search": "web_search_20250305", "web_fetch": "web_fetch_20250910"}
"""The versions of Anthropic's server tools Keel declares (the SDK's ``WebSearchTool20250305
Param`` and ``WebFetchTool20250910Param``)."""
MAX_PAUSES = 3
"""How many times a turn the server paused (``stop_reason: "pause_turn"``, a long run of server
tool calls) is sent back to be continued before its answer is taken as it stands."""


def hosted_tool(tool: HostedTool) -> dict[str, Any]:
    """A server tool's declaration (the SDK's ``WebSearchTool20250305Param`` and
    ``WebFetchTool20250910Param``)."""
    declared: dict[str, Any] = {"type": _HOSTED_TYPES[tool.kind], "name": tool.kind}
    if tool.max_uses is not None:
        declared["max_uses"] = tool.max_uses
    if tool.domains:
        declared["allowed_domains"] = list(tool.domains)
    if tool.kind == "web_fetch":  # the page's citations, as web search gives its results'
        declared["citations"] = {"enabled": True}
    return declared


def replayed_content(
    message: AssistantMessage, content: list[Any], ids: Mapping[str, str]
) -> list[_Block]:
    """A turn that used server tools, its blocks in the order received (ADR 0067): thinking,
    server tool calls and their results (encrypted content included) whole, text blocks whole
    with their citations while their text is the message's; the calls are the message's own,
    each at the place of the ``tool_use`` it was received as."""
    texts = [b for b in content if isinstance(b, Mapping) and b.get("type") == "text"]
    own_text = "".join(str(b.get("text") or "") for b in texts) == (message.text or "")
    unplaced: dict[str, list[ToolCall]] = {}
    for call in message.tool_calls:
        unplaced.setdefault(call.provider_call_id, []).append(call)
    placed: set[str] = set()
    blocks: list[_Block] = []
    text_sent = False
    for block in content:
        kind = block.get("type") if isinstance(block, Mapping) else None
        if (
            kind in OPAQUE_BLOCKS
            or kind in SERVER_BLOCKS
            or (kind == "text" and own_text and block.get("text"))
        ):
            blocks.append(dict(block))
        elif kind == "text" and not text_sent and message.text and message.text.strip():
            blocks.append({"type": "text", "text": message.text})  # changed since: Keel's text
        elif kind == "tool_use" and (queue := unplaced.get(block.get("id"))):
            call = queue.pop(0)
            placed.add(call.id)
            blocks.append(tool_use_block(call, ids[call.id]))
        text_sent = text_sent or kind == "text"
    if not text_sent and message.text and message.text.strip():  # text the layout has no place for
        first = next((n for n, b in enumerate(blocks) if b["type"] not in OPAQUE_BLOCKS), None)
        blocks.insert(len(blocks) if first is None else first,
                      {"type": "text", "text": message.text})  # fmt: skip
    blocks.extend(tool_use_block(c, ids[c.id]) for c in message.tool_calls if c.id not in placed)
    return blocks


async def continued(
    body: dict[str, Any],
    send: Callable[[dict[str, Any]], Awaitable[dict[str, Any] | None]],
    read: Callable[[dict[str, Any]], ModelResponse],
) -> ModelResponse | None:
    """One turn: the answer to `body`, and while the server paused it (``pause_turn``, a long
    run of server tool calls), the answer to the request with the paused turn appended, as the
    API asks; the parts are one turn, their blocks in order and their usage summed."""
    message = await send(body)
    for _ in range(MAX_PAUSES):
        if message is None or message.get("stop_reason") != "pause_turn":
            break
        content = _blocks(message)
        sent = {**body, "messages": [*body["messages"], {"role": "assistant", "content": content}]}
        more = await send(sent)
        if more is None:
            break
        message = {**more, "content": [*content, *_blocks(more)],
                   "usage": _summed(message.get("usage"), more.get("usage"))}  # fmt: skip
    return None if message is None else read(message)


def _blocks(message: dict[str, Any]) -> list[Any]:
    content = message.get("content")
    return content if isinstance(content, list) else []


def _summed(first: Any, second: Any) -> dict[str, Any]:
    """Two usage objects' token counts added (each part of a continued turn is billed)."""
    one = first if isinstance(first, Mapping) else {}
    two = second if isinstance(second, Mapping) else {}
    total: dict[str, Any] = {}
    for key in {*one, *two}:
        a, b = one.get(key), two.get(key)
        if isinstance(a, int) and isinstance(b, int):
            total[key] = a + b
        elif isinstance(a, Mapping) and isinstance(b, Mapping):
            total[key] = _summed(a, b)
        else:
            total[key] = b if b is not None else a
    return total


def tool_use_block(call: ToolCall, wire_id: str) -> _Block:
    # Unparseable (or non-object) arguments go out as {} under the same id, so the call still
    # pairs with its error result and the history stays valid.
    arguments = call.arguments if call.parse_error is None else None
    payload = arguments if isinstance(arguments, dict) else {}
    return {"type": "tool_use", "id": wire_id, "name": call.name, "input": payload}
