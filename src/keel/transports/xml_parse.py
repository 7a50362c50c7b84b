"""Reading tool calls out of a text-only model's answer: pure, tolerant, never raising.

The XML fallback asks the model to write ``<call name="TOOL">{...json...}</call>``. Small
models write it imperfectly: inside code fences, between sentences, with single quotes or no
quotes around the name, without the closing tag (a stop sequence cut it off), with broken JSON.
`parse_calls` takes what it can and turns everything else into *something the runtime answers*:
a block whose JSON is broken keeps its raw text (the tool executor replies "invalid JSON"), a
block without a readable name is named `UNNAMED_CALL` (the executor replies "unknown tool" and
lists the real ones). A model's mistake is therefore one error result it can read and fix, never
an exception and never a silently dropped call.

The framing follows the JSON first: the arguments end at the bracket that closes the object
(strings skipped), so a ``</call>`` inside a JSON string cannot cut a block short, and a missing
closing tag is recovered when the object is followed only by the next block or the end of the
text. Only when that fails does the first ``</call>`` end the block.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Callable
from dataclasses import dataclass

from keel.messages import ToolCall

__all__ = ["UNNAMED_CALL", "ParsedText", "parse_calls"]

UNNAMED_CALL = "invalid_call"
"""The name given to a block that names no tool: no tool has it, so the model is told which do."""

_NAME_ATTRIBUTES = ("name", "tool", "tool_name", "function")
"""Attribute spellings models use for the tool's name; the first one present wins."""

# `<tool_call>` is accepted too: Qwen-family models fall back to their native spelling.
_OPEN = re.compile(r"<\s*(?:tool_)?call\b([^<>]*)>", re.IGNORECASE)
_CLOSE = re.compile(r"<\s*/\s*(?:tool_)?call\s*>", re.IGNORECASE)
_ATTRIBUTE = re.compile(r"""([A-Za-z_][\w.-]*)\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s"'=<>`/]+))""")
_FENCE_OPEN = re.compile(r"\s*```[\w-]*[ \t]*\n?")
_FENCE_CLOSE = re.compile(r"\s*```")
_LOOSE_END = re.compile(r"\s*(?:```[\w-]*)?\s*")
"""What may follow an unclosed block's JSON: nothing, or a fence, before the next block."""
_FENCE_BEFORE = re.compile(r"```[\w-]*\s*\Z")
_FENCE_AFTER = re.compile(r"\s*```[ \t]*(?=\n|\Z)")
_JSON_TOKEN = re.compile(r'"(?:[^"\\\x00-\x1f]|\\[^\x00-\x1f])*"|[{}\[\]]|[\w\s:,.+-]+')
"""One piece of JSON text: a whole string, a bracket, or a run of anything else JSON allows."""


@dataclass(frozen=True, slots=True)
class ParsedText:
    """A model's answer split into its prose and the calls it wrote."""

    text_without_calls: str
    """Everything outside the call blocks, with fences left empty by the blocks removed."""
    calls: list[ToolCall]
    """The calls in the order written; ids come from the `new_id` given to `parse_calls`."""


@dataclass(frozen=True, slots=True)
class _Block:
    start: int
    end: int
    name: str
    raw_arguments: str


def parse_calls(text: str, new_id: Callable[[], str] | None = None) -> ParsedText:
    """Split `text` into prose and tool calls; never raises on any input text.

    `new_id` makes one call id per call (the transport numbers them ``xml_<n>``); without it
    the calls are numbered from ``xml_1`` within this text.
    """
    blocks = _find_blocks(text)
    if not blocks:
        return ParsedText(text, [])
    numbers = iter(range(1, len(blocks) + 1))
    make_id = new_id or (lambda: f"xml_{next(numbers)}")
    calls = [ToolCall.from_raw(make_id(), b.name, b.raw_arguments) for b in blocks]
    pieces, cursor = [], 0
    for start, end in _removed_spans(text, blocks):
        pieces.append(text[cursor:start].strip())
        cursor = end
    pieces.append(text[cursor:].strip())
    return ParsedText("\n\n".join(p for p in pieces if p), calls)


def _removed_spans(text: str, blocks: list[_Block]) -> list[tuple[int, int]]:
    """The spans to cut: runs of blocks separated only by white space, each with the code
    fence around it when the fence holds nothing else (```xml <call ...>...</call> ```)."""
    runs: list[tuple[int, int]] = []
    for block in blocks:
        if runs and text[runs[-1][1] : block.start].strip() == "":
            runs[-1] = (runs[-1][0], block.end)
        else:
            runs.append((block.start, block.end))
    spans: list[tuple[int, int]] = []
    fences, counted = 0, 0  # fences seen in text[:counted], to tell openers from closers
    for start, end in runs:
        floor = spans[-1][1] if spans else 0
        opener = _FENCE_BEFORE.search(text, floor, start)
        closer = _FENCE_AFTER.match(text, end)
        if opener is not None:
            fences += text.count("```", counted, opener.start())
            counted = opener.start()
        if (
            opener is not None
            and fences % 2 == 0  # an opening fence, not the end of a code block before
            and (closer is not None or text[end:].strip() == "")
        ):
            start, end = opener.start(), closer.end() if closer is not None else len(text)
        spans.append((start, end))
    return spans


def _find_blocks(text: str) -> list[_Block]:
    blocks: list[_Block] = []
    pos = 0
    while (opening := _OPEN.search(text, pos)) is not None:
        block = _read_block(text, opening)
        if block is None:
            pos = opening.end()
            continue
        blocks.append(block)
        pos = max(block.end, opening.end())
    return blocks


def _read_block(text: str, opening: re.Match[str]) -> _Block | None:
    """The block that `opening` starts, or None when it is only a mention of ``<call>``."""
    attributes = opening.group(1)
    name = _name_from(attributes)
    start, body_start = opening.start(), opening.end()
    if attributes.rstrip().endswith("/"):  # <call name="x"/>: a call without arguments
        return _Block(start, body_start, name or UNNAMED_CALL, "")
    next_open = _OPEN.search(text, body_start)
    limit = next_open.start() if next_open else len(text)

    decoded = _json_extent(text, body_start)
    if decoded is not None:
        json_start, json_end = decoded
        after = _skip_fence_close(text, json_end)
        closing = _CLOSE.match(text, after)
        if closing is not None:
            return _block(start, closing.end(), name, text[json_start:json_end])
        following = _OPEN.search(text, json_end)
        stop = following.start() if following else len(text)
        if _LOOSE_END.fullmatch(text, json_end, stop):  # unclosed, but the JSON is whole
            return _block(start, json_end, name, text[json_start:json_end])

    closing = _CLOSE.search(text, body_start, limit)
    if closing is not None:
        return _block(start, closing.end(), name, _unfence(text[body_start : closing.start()]))
    body = text[body_start:limit]
    if name is None and not body.lstrip().startswith(("{", "`")):
        return None  # "<call>" in prose, with no name, no JSON and no closing tag
    return _block(start, limit, name, _unfence(body))


def _block(start: int, end: int, name: str | None, raw: str) -> _Block:
    """A block; when the tag names no tool, a JSON body of {"name", "arguments"} may."""
    raw = raw.strip()
    if name is None:
        name, raw = _name_from_body(raw)
    return _Block(start, end, name, raw)


def _name_from(attributes: str) -> str | None:
    found: dict[str, str] = {}
    for match in _ATTRIBUTE.finditer(attributes):
        value = next(g for g in match.group(2, 3, 4) if g is not None)
        found.setdefault(match.group(1).lower(), value)
    for key in _NAME_ATTRIBUTES:
        value = html.unescape(found.get(key, "")).strip()
        if value:
            return value
    return None


def _name_from_body(raw: str) -> tuple[str, str]:
    """Accept ``<call>{"name": "fetch", "arguments": {...}}</call>``, which models trained on
    other formats write; anything else keeps its raw text under `UNNAMED_CALL`."""
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        return UNNAMED_CALL, raw
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return UNNAMED_CALL, raw
    arguments = value.get("arguments", value.get("parameters", {}))
    if not value["name"].strip():
        return UNNAMED_CALL, raw
    if isinstance(arguments, str):  # JSON encoded twice, as Chat Completions sends it
        return value["name"].strip(), arguments
    try:
        return value["name"].strip(), json.dumps(arguments, ensure_ascii=False)
    except (ValueError, TypeError, RecursionError):
        return UNNAMED_CALL, raw


def _json_extent(text: str, body_start: int) -> tuple[int, int] | None:
    """(start, end) of the JSON object that opens the block body, when there is one.

    Only the extent is found here, by matching brackets outside strings; whether the text is
    valid JSON is `ToolCall.from_raw`'s judgement, on that slice alone. The scan stops at the
    first character JSON cannot have (``<`` of a next block, a raw newline inside a string), so
    a long answer full of broken blocks is still read in linear time.
    """
    fence = _FENCE_OPEN.match(text, body_start)
    pos = fence.end() if fence else body_start
    while pos < len(text) and text[pos].isspace():
        pos += 1
    if not text.startswith("{", pos):
        return None
    json_start, depth = pos, 0
    while (token := _JSON_TOKEN.match(text, pos)) is not None:
        pos = token.end()
        if token.group() in ("{", "["):
            depth += 1
        elif token.group() in ("}", "]"):
            depth -= 1
            if depth == 0:
                return json_start, pos
    return None


def _skip_fence_close(text: str, pos: int) -> int:
    fence = _FENCE_CLOSE.match(text, pos)
    end = fence.end() if fence else pos
    while end < len(text) and text[end].isspace():
        end += 1
    return end


def _unfence(body: str) -> str:
    """The body without a code fence around it: ```json {...} ``` -> {...}."""
    stripped = body.strip()
    if stripped.startswith("```"):
        stripped = _FENCE_OPEN.sub("", stripped, count=1)
        if stripped.rstrip().endswith("```"):
            stripped = stripped.rstrip()[:-3]
    return stripped.strip()
