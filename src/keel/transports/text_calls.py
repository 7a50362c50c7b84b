"""Tool calls a chat server handed back as text: a chat template's pseudo-call (issue 37).

A server that does not parse its chat template's calls returns them as the answer's text:

- ``functions.NAME:`` then a JSON object, once or more: llama-cpp-python's
  ``chatml-function-calling`` chat format (whose prompt HTML-escapes replayed calls, so the model
  may write ``{&#34;path&#34;: ...}``);
- ``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` blocks, or that JSON object bare:
  a model's own chat template (Qwen, Hermes), served by one that passes the template's text
  through (llama-cpp-python's server without ``--chat_format``);
- ``["NAME", {...}]``, a JSON array of a known tool's name and its arguments, closed or not:
  a small model behind such a server wrote ``["read_file", {"path": ...}`` and stopped (ADR
  0065); unclosed, it is refused rather than kept as the answer.

`read_text_calls` finds such an answer. Each call is read when it names a tool of the request
and its arguments are a JSON object; otherwise the answer is refused (`TextCalls.problem`), so a
pseudo-call is never taken for the run's answer. Bare JSON counts only when its ``name`` is a
known tool (any other JSON object is an ordinary answer, such as a structured one).
`calls_in_text` applies it to a Chat Completions answer (`keel.transports.openai_chat`).

The text is the model's: every scan here is linear in it (ADR 0062). Blocks are cut with
`str.find`, not a lazy regex followed by `\\s*` (quadratic over a run of white space), and
blanks are skipped in place, never by slicing the rest of the text once per call.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from typing import Any

from keel.errors import ProviderError
from keel.messages import ModelRequest, ModelResponse, ToolCall

__all__ = [
    "ARRAY_FORMAT",
    "BARE_FORMAT",
    "FUNCTIONS_FORMAT",
    "TAGS_FORMAT",
    "TextCalls",
    "calls_in_text",
    "read_text_calls",
    "tool_call_blocks",
]

FUNCTIONS_FORMAT = "llama-cpp-python's chatml-function-calling chat format"
TAGS_FORMAT = "the model's own chat template (<tool_call> blocks, as Qwen and Hermes write them)"
BARE_FORMAT = "the model's own chat template (a call as bare JSON)"
ARRAY_FORMAT = 'a chat template\'s call as a JSON array (["NAME", {arguments}])'

_FUNCTION = re.compile(r"functions\.([A-Za-z0-9_.\-]+?):\s*")
_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_ESCAPES = ("&#34;", "&quot;", "&#39;", "&lt;", "&gt;", "&amp;")
_DECODER = json.JSONDecoder()


@dataclass(frozen=True, slots=True)
class TextCalls:
    """What an answer's text held: its calls as (name, arguments JSON), in order, or the
    `problem` that keeps them from being read; `format` names the chat format that writes them."""

    format: str
    calls: tuple[tuple[str, str], ...] = ()
    problem: str | None = None


def read_text_calls(text: str, tools: Collection[str]) -> TextCalls | None:
    """The pseudo-calls `text` is made of, or None when it is an ordinary answer."""
    body = text.strip()
    if any(escape in body for escape in _ESCAPES):
        import html  # only here: a scripted run loads no more than it needs (ADR 0042)

        body = html.unescape(body)
    if body.startswith("functions."):
        return _functions(body, tools)
    if body.startswith("<tool_call>"):
        return _blocks(body, tools)
    if body.startswith("{"):
        return _bare(body, tools)
    if body.startswith("["):
        return _array(body, tools)
    return None


def _array(body: str, tools: Collection[str]) -> TextCalls | None:
    """``["NAME", {...}]``: a call when NAME is a known tool and an object follows it; an
    array of anything else is an ordinary answer."""
    start = _blanks_end(body, 1)
    try:
        name, end = _DECODER.raw_decode(body, start)
    except (ValueError, RecursionError):
        return None
    comma = _blanks_end(body, end)
    if not (isinstance(name, str) and name in tools and body.startswith(",", comma)):
        return None
    if not body.startswith("{", _blanks_end(body, comma + 1)):
        return None
    try:
        whole, _ = _DECODER.raw_decode(body, 0)
    except (ValueError, RecursionError):
        return TextCalls(ARRAY_FORMAT, problem=f"its call of {name} is not a closed JSON array")
    if not (isinstance(whole, list) and len(whole) == 2 and isinstance(whole[1], dict)):
        return TextCalls(ARRAY_FORMAT, problem=f"it is not [{name!r}, {{arguments}}]")
    return TextCalls(ARRAY_FORMAT, ((name, json.dumps(whole[1], ensure_ascii=False)),))


def _functions(body: str, tools: Collection[str]) -> TextCalls | None:
    calls: list[tuple[str, str]] = []
    at = 0
    while at < len(body):
        match = _FUNCTION.match(body, at)
        if match is None:
            if not calls:
                return None
            break  # text after the calls: the model went on talking, the calls stand
        name = match.group(1)
        arguments, at = _object(body, match.end())
        if arguments is None:
            return TextCalls(
                FUNCTIONS_FORMAT, problem=f"its arguments for {name} are not a JSON object"
            )
        if name not in tools:
            return TextCalls(
                FUNCTIONS_FORMAT, problem=f"it names {name}, which is no tool of this run"
            )
        calls.append((name, json.dumps(arguments, ensure_ascii=False)))
        at = _blanks_end(body, at)
    return TextCalls(FUNCTIONS_FORMAT, tuple(calls))


def _blocks(body: str, tools: Collection[str]) -> TextCalls:
    calls: list[tuple[str, str]] = []
    for block in tool_call_blocks(body):
        call, _ = _object(block, 0)
        read = _named_call(call, tools)
        if isinstance(read, str):
            return TextCalls(TAGS_FORMAT, problem=read)
        calls.append(read)
    if not calls:
        return TextCalls(TAGS_FORMAT, problem="its <tool_call> block holds no call")
    return TextCalls(TAGS_FORMAT, tuple(calls))


def _bare(body: str, tools: Collection[str]) -> TextCalls | None:
    calls: list[tuple[str, str]] = []
    at = 0
    while at < len(body) and body[at] == "{":
        call, end = _object(body, at)
        if not (isinstance(call, dict) and call.get("name") in tools and "arguments" in call):
            break  # not a call of a known tool: an ordinary JSON answer, or what follows calls
        read = _named_call(call, tools)
        if isinstance(read, str):
            return TextCalls(BARE_FORMAT, problem=read)
        calls.append(read)
        at = _blanks_end(body, end)
    return TextCalls(BARE_FORMAT, tuple(calls)) if calls else None


def _named_call(call: Any, tools: Collection[str]) -> tuple[str, str] | str:
    """(name, arguments JSON) of a ``{"name", "arguments"}`` object, else what is wrong."""
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return 'it is not a JSON object {"name": ..., "arguments": {...}}'
    name, arguments = call["name"], call.get("arguments", {})
    if name not in tools:
        return f"it names {name}, which is no tool of this run"
    if isinstance(arguments, str):  # a template that replays arguments as a JSON string
        arguments, _ = _object(arguments, 0)
    if not isinstance(arguments, dict):
        return f"its arguments for {name} are not a JSON object"
    return name, json.dumps(arguments, ensure_ascii=False)


def _object(text: str, at: int) -> tuple[Any, int]:
    """The JSON object at `at` (after blanks) and where it ends, or (None, at)."""
    start = _blanks_end(text, at)
    try:
        value, end = _DECODER.raw_decode(text, start)
    except (ValueError, RecursionError):
        return None, at
    return (value, end) if isinstance(value, dict) else (None, at)


def tool_call_blocks(text: str) -> list[str]:
    """The body of each ``<tool_call>`` block, white space stripped; the last one may run to
    the end of the text unclosed. What ``<tool_call>\\s*(.*?)\\s*(?:</tool_call>|\\Z)`` finds,
    in linear time."""
    blocks: list[str] = []
    at = 0
    while (start := text.find(_OPEN, at)) >= 0:
        body = start + len(_OPEN)
        end = text.find(_CLOSE, body)
        if end < 0:
            blocks.append(text[body:].strip())
            break
        blocks.append(text[body:end].strip())
        at = end + len(_CLOSE)
    return blocks


def _blanks_end(text: str, at: int) -> int:
    """The first position at or after `at` that is not white space."""
    while at < len(text) and text[at].isspace():
        at += 1
    return at


def calls_in_text(
    response: ModelResponse, request: ModelRequest, *, new_id: Callable[[], str] | None = None
) -> ModelResponse:
    """`response` with the tool calls its text spells out (a chat template's pseudo-call) as
    calls; a ProviderError (not retried) when they cannot be read. A turn that allows no calls
    (a synthesis turn) is left as written: the run decides what such a reply is
    (keel/_run/unanswered.py), never its answer and never a failure (PC-02, ADR 0065)."""
    if response.tool_calls or not response.text or not request.tools:
        return response
    if request.tool_choice == "none":
        return response
    found = read_text_calls(response.text, {tool.name for tool in request.tools})
    if found is None:
        return response
    problem = found.problem
    if problem is None:
        make = new_id or _new_call_id
        calls = tuple(ToolCall.from_raw(make(), name, args) for name, args in found.calls)
        return replace(response, text=None, tool_calls=calls)
    shown = " ".join(response.text.split())
    shown = shown if len(shown) <= 120 else shown[:119] + "…"
    if found.format == FUNCTIONS_FORMAT:
        why = (
            "; that format also drops every tool result (it has no tool role), so the model "
            "never sees what its tools returned"
        )
    else:
        why = ", which the server did not read as a call"
    raise ProviderError(
        f"the server answered with a tool call written as text ({shown!r}), as {found.format} "
        f"writes one{why}; it was not kept as the answer, because {problem}. Use "
        "xml:openai-chat:MODEL (Keel writes and reads the calls itself), or serve the model "
        "with its own chat template (llama-cpp-python's server without --chat_format)",
        retryable=False,
    )


def _new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"
