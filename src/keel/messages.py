"""Keel's own message types: neutral, immutable, and the same for every provider.

Transports map these to and from their wire formats; nothing inside the runtime speaks a
vendor's format. Vendor data that must round-trip (reasoning items, signatures) rides in
``provider_details``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

from keel.canonical import call_key, canonical_json, key_from_text, parse_arguments

__all__ = [
    "AssistantMessage",
    "Item",
    "ModelRequest",
    "ModelResponse",
    "SynthesisReason",
    "ToolCall",
    "ToolChoice",
    "ToolDefinition",
    "ToolResult",
    "Usage",
    "UserMessage",
    "digest_text",
]

ToolChoice = Literal["none", "required"] | None
"""None: the provider's default (the model may call a tool or answer); "none": no tool call
(synthesis-only turns); "required": a tool call, not an answer (a run insisting on evidence
first, ``--first-turn-tool``)."""
class SynthesisReason(StrEnum):
    """Why a turn is synthesis-only: a closed set, matched exhaustively wherever it decides
    something (the failure kind of a tool request in that turn, the control it carries).
    Stored and printed as its value."""

    REPEATED_TOOL = "repeated_tool"
    BUDGET = "budget"


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call the model asked for."""

    id: str
    """The provider's call id (or one Keel made up), pairing the call with its result."""
    name: str
    """The tool's name as the model wrote it; may name no tool."""
    raw_arguments: str
    """The argument text exactly as the model wrote it."""
    arguments: Any
    """The parsed arguments, or None when `raw_arguments` is not valid JSON."""
    parse_error: str | None
    """Why `raw_arguments` did not parse, for the error result the model gets back."""
    key: str
    """The call key (name plus canonical arguments) the breaker counts."""

    @classmethod
    def from_raw(cls, id: str, name: str, raw_arguments: str) -> ToolCall:
        arguments, error = parse_arguments(raw_arguments)
        return cls(id, name, raw_arguments, arguments, error, key_from_text(name, raw_arguments))

    @classmethod
    def from_arguments(cls, id: str, name: str, arguments: dict[str, Any]) -> ToolCall:
        return cls(id, name, canonical_json(arguments), arguments, None, call_key(name, arguments))


@dataclass(frozen=True, slots=True)
class UserMessage:
    """The question, or a later message from the person running the agent."""

    text: str
    kind: Literal["user"] = "user"


@dataclass(frozen=True, slots=True)
class AssistantMessage:
    """One model turn as it entered the history: text, tool calls, or both."""

    text: str | None
    tool_calls: tuple[ToolCall, ...] = ()
    provider_details: dict[str, Any] = field(default_factory=dict)
    """Vendor data the provider needs to see again when the turn is replayed."""
    kind: Literal["assistant"] = "assistant"


@dataclass(frozen=True, slots=True)
class ToolResult:
    """The answer to one tool call, as the model will read it."""

    call_id: str
    name: str
    call_key: str
    content: str
    """What the model is shown: the result, or its truncated head, or an elision pointer."""
    is_error: bool = False
    size: int = 0
    """Characters in the full result, before any truncation."""
    digest: str = ""
    """sha256 of the full result, so a pointer or a truncated view names what it stands for."""
    truncated: bool = False
    elided: bool = False
    uncertain: bool = False
    """A side-effecting call whose effect is unknown (interrupted before its result)."""
    kind: Literal["tool_result"] = "tool_result"


Item = UserMessage | AssistantMessage | ToolResult


@dataclass(frozen=True, slots=True)
class ToolDefinition:
    """What a model is told about a tool."""

    name: str
    description: str
    parameters: dict[str, Any]
    """JSON Schema of the arguments object."""


@dataclass(frozen=True, slots=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cached_input_tokens + other.cached_input_tokens,
        )

    @property
    def total(self) -> int:
        return self.input_tokens + self.output_tokens


@dataclass(frozen=True, slots=True)
class ModelRequest:
    """Everything one model call needs; transports map it, nothing else."""

    system: str
    """Frozen prefix, part one: byte-identical on every turn of a run."""
    tools: tuple[ToolDefinition, ...]
    """Frozen prefix, part two: kept even in synthesis turns so history replays."""
    items: tuple[Item, ...]
    """The history, with elided results already replaced by their pointers."""
    tool_choice: ToolChoice = None
    """None sends no tool_choice at all; "none" forbids tools (synthesis-only turns);
    "required" asks for a tool call (never sent without tools)."""
    volatile: tuple[str, ...] = ()
    """Controls for this request only: appended last, never stored, never in the prefix."""
    estimated_input_tokens: int = 0
    """The context builder's count, so nobody re-tokenises the history to know it."""
    settled_items: int = 0
    """Leading items no later request of the run changes (up to the last elided result): a
    provider cache breakpoint after them stays useful for the rest of the run."""
    cache_key: str | None = None
    """The same for every request of a run (its id): providers that route by a cache key
    (OpenAI's ``prompt_cache_key``) send the run's requests to the same cache."""
    repeated_prefix_tokens: int = field(default=0, compare=False)
    """Estimated tokens at the start of this request that repeat the previous request byte for
    byte (the frozen prefix and the unchanged history), what a prompt cache can serve; 0 for a
    run's first request in a process. Not part of equality: a resumed run's first request is
    the same request, with no previous one to repeat."""


@dataclass(frozen=True, slots=True)
class ModelResponse:
    """What one model call returned, already mapped out of the wire format."""

    text: str | None
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage = field(default_factory=Usage)
    stop_reason: str | None = None
    provider_details: dict[str, Any] = field(default_factory=dict)
    response_id: str | None = None
    """The provider's id for this response, when it gives one (for traces; never sent back)."""

    @property
    def is_empty(self) -> bool:
        return not self.tool_calls and not (self.text and self.text.strip())

    @property
    def cut_off(self) -> bool:
        """The provider stopped it at its output-token limit: the text may end mid-sentence."""
        return self.stop_reason in CUT_OFF_REASONS


CUT_OFF_REASONS = frozenset({"length", "max_tokens", "max_output_tokens"})
"""Stop reasons that mean "cut at the output limit": Chat Completions and llama.cpp say
``length``, Anthropic ``max_tokens``, the Responses API ``max_output_tokens``."""


def digest_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
