"""Qwen2.5's chat format with tools: the prompt the model was trained on, and its calls read back.

The embedded model (Qwen2.5-Coder) learned tool use in the chat template that ships inside its
GGUF file (``tokenizer.chat_template``). `render_prompt` writes that template's output for a
`ModelRequest`, byte for byte (a test renders the model's own template with Jinja and compares):

- the system turn: Keel's system text, then the template's ``# Tools`` section with one JSON line
  per tool (``{"type": "function", "function": {name, description, parameters}}``) between
  ``<tools>`` tags, and the instruction to answer calls as ``<tool_call>{"name", "arguments"}
  </tool_call>``. The tools stay in synthesis turns too: the grammar (`grammar`, beside it) is
  what forbids a call there, so the system turn, the longest part of the prompt, is the same
  every turn and llama.cpp reuses it from its cache;
- the history: user turns, assistant turns (text, then each call as a ``<tool_call>`` block),
  and each run of tool results as one user turn of ``<tool_response>`` blocks;
- the volatile controls, one per line, as the last user turn, then the opening of the
  assistant's turn.

Text from outside (the question, tool results, earlier answers) cannot open a role or fake a
block: the spellings of control tokens (``<|im_start|>``...) and of the tool tags get a zero-width
space after their ``<``, and lone surrogates become ``?`` (the prompt is strict UTF-8).

`read_output` turns what the model wrote into text or calls: the output is a call when it starts
with ``<tool_call>``, or with ``{"name"`` (the call without its tags, which the grammar also
lets the small model write), and never in a synthesis turn, where nothing is read as a call
whatever the text says. A block that does not parse (cut at the
context window) still becomes a `ToolCall` with a parse error, which the executor answers.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence

from keel.messages import (
    AssistantMessage,
    Item,
    ModelRequest,
    ToolCall,
    ToolChoice,
    ToolDefinition,
    ToolResult,
)
from keel.transports.text_calls import tool_call_blocks

__all__ = [
    "CALL_CLOSE",
    "CALL_OPEN",
    "DEFAULT_SYSTEM",
    "UNNAMED_CALL",
    "call_text",
    "clean",
    "highest_call_number",
    "read_output",
    "render_prompt",
    "tool_line",
]

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
CALL_OPEN, CALL_CLOSE = "<tool_call>\n", "\n</tool_call>"
DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
"""The template's system text when a request has none."""
UNNAMED_CALL = "(unparsed tool call)"
"""The name of a call whose block could not be read; no tool has it, so it is answered as such."""

_TOOLS_HEAD = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_TOOLS_TAIL = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)
_DEFUSE = re.compile(r"<(?=\|\w{1,40}\|>|/?(?:tool_call|tool_response|tools)>)")
_ZERO_WIDTH = "\u200b"
_CALL_NUMBER = re.compile(r"local_(\d{1,18})")


def clean(text: str) -> str:
    """Outside text as the prompt may carry it: no control-token or tool-tag spellings, valid
    UTF-8. Nothing else changes (removing the zero-width spaces gives the text back)."""
    if "<" in text:
        text = _DEFUSE.sub("<" + _ZERO_WIDTH, text)
    if not text.isascii():
        text = text.encode("utf-8", "replace").decode("utf-8")
    return text


def _dumps(value: object) -> str:
    """JSON as the template's ``tojson`` writes it (Python's defaults, non-ASCII kept)."""
    return json.dumps(value, ensure_ascii=False)


def tool_line(tool: ToolDefinition) -> str:
    """One tool inside ``<tools>``, as the template writes it."""
    function = {"name": tool.name, "description": tool.description, "parameters": tool.parameters}
    return _dumps({"type": "function", "function": function})


def call_text(call: ToolCall) -> str:
    """A call as the model writes it (and as the grammar lets it), so a replayed turn is the
    same text the model produced and the cached prefix holds."""
    arguments = _dumps(call.arguments) if call.parse_error is None else clean(call.raw_arguments)
    return f'{CALL_OPEN}{{"name": {_dumps(call.name)}, "arguments": {arguments}}}{CALL_CLOSE}'


def render_prompt(request: ModelRequest) -> str:
    """The whole prompt for `request`, ending with the assistant turn's opening (pure)."""
    parts = [_system(request.system, request.tools)]
    parts.extend(_history(request.items))
    if request.volatile:  # one last user turn: a small model reads a run of them as noise
        parts.append(_turn("user", "\n".join(clean(text) for text in request.volatile)))
    parts.append(f"{IM_START}assistant\n")
    return "".join(parts)


def _system(system: str, tools: Sequence[ToolDefinition]) -> str:
    text = clean(system) if system else DEFAULT_SYSTEM
    if tools:
        lines = "".join("\n" + tool_line(tool) for tool in tools)
        text = f"{text}{_TOOLS_HEAD}{lines}{_TOOLS_TAIL}"
    return _turn("system", text)


def _turn(role: str, text: str) -> str:
    return f"{IM_START}{role}\n{text}{IM_END}\n"


def _history(items: Iterable[Item]) -> Iterable[str]:
    results: list[str] = []
    for item in items:
        if isinstance(item, ToolResult):
            content = clean(_result_text(item))
            results.append(f"\n<tool_response>\n{content}\n</tool_response>")
            continue
        if results:
            yield f"{IM_START}user{''.join(results)}{IM_END}\n"
            results = []
        if isinstance(item, AssistantMessage) and item.tool_calls:
            text = f"\n{clean(item.text)}" if item.text else ""
            calls = "".join("\n" + call_text(call) for call in item.tool_calls)
            yield f"{IM_START}assistant{text}{calls}{IM_END}\n"
        elif isinstance(item, AssistantMessage):
            yield _turn("assistant", clean(item.text or ""))
        else:
            yield _turn("user", clean(item.text))
    if results:
        yield f"{IM_START}user{''.join(results)}{IM_END}\n"


def _result_text(result: ToolResult) -> str:
    """Qwen's format has no error flag either: an error result is marked in its text, as the
    OpenAI transports do (unless it already starts with "error", as Keel's own error texts do)."""
    if result.is_error and not result.content.lstrip().lower().startswith("error"):
        return "ERROR: " + result.content
    return result.content


# --- reading the output -----------------------------------------------------------------------


def highest_call_number(items: Iterable[Item]) -> int:
    """The highest ``local_<n>`` call id in a history: new ids continue after it, so ids stay
    unique in a run without any state in the transport (a resumed run replays its history)."""
    highest = 0
    for item in items:
        if isinstance(item, AssistantMessage):
            for call in item.tool_calls:
                match = _CALL_NUMBER.fullmatch(call.provider_call_id)
                if match:
                    highest = max(highest, int(match.group(1)))
    return highest


def read_output(
    text: str, tool_choice: ToolChoice, new_id: Callable[[], str]
) -> tuple[str | None, tuple[ToolCall, ...]]:
    """The answer text, or the calls, in what the model wrote (pure apart from `new_id`).

    Never raises. In a synthesis turn (tool_choice "none") the output is always text.
    """
    stripped = text.strip()
    if tool_choice != "none" and stripped.startswith("<tool_call>"):
        return None, tuple(_read_call(block, new_id()) for block in tool_call_blocks(text))
    if tool_choice != "none" and stripped.startswith('{"name"'):  # a call without its tags
        return None, (_read_call(stripped, new_id()),)
    return (text if stripped else None), ()


def _read_call(block: str, call_id: str) -> ToolCall:
    """One block; one that does not parse is a call to no tool, answered with an error."""
    try:
        data = json.loads(block)
    except (ValueError, RecursionError):
        data = None
    name = data.get("name") if isinstance(data, dict) else None
    if isinstance(name, str) and isinstance(data.get("arguments"), dict):
        return ToolCall.from_arguments(call_id, name, data["arguments"])
    return ToolCall.from_raw(call_id, UNNAMED_CALL, block)
