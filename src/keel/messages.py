"""Keel's own message types: neutral, immutable, and the same for every provider.

Transports map these to and from their wire formats; nothing inside the runtime speaks a
vendor's format. Vendor data that must round-trip (reasoning items, signatures) rides in
``provider_details``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, Literal

from keel.canonical import call_key, canonical_json, key_from_text, parse_arguments
from keel.codec import OMIT_EMPTY

__all__ = [
    "AssistantMessage",
    "Item",
    "ModelRequest",
    "ModelResponse",
    "OutputSchema",
    "SynthesisReason",
    "ToolCall",
    "ToolChoice",
    "ToolDefinition",
    "ToolResult",
    "Usage",
    "UserMessage",
    "digest_text",
    "keel_call_id",
    "wire_call_ids",
    "with_keel_ids",
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
    DEADLINE = "deadline"
    """Less time is left before the run's deadline than one more turn is estimated to take."""
    CONTEXT = "context"
    """The next request would not fit the model's window even with every older result elided
    and the latest batch clamped, or the provider refused it as too long twice (issue 44)."""


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call the model asked for."""

    id: str
    """Keel's id for the call, unique in the run (`keel_call_id`): what pairs the call with its
    result, and what approvals, decisions and the journal name. A transport fills in the
    provider's id; the run gives each call its own as the turn arrives (`with_keel_ids`), so a
    provider that repeats ids cannot make two calls one. Calls recorded before Keel gave ids of
    its own keep the provider's."""
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
    provider_id: str | None = None
    """The provider's id for the call once Keel gave it its own; None while `id` is the
    provider's. Only the wire uses it (`wire_call_ids`)."""

    @classmethod
    def from_raw(
        cls, id: str, name: str, raw_arguments: str, *, provider_id: str | None = None
    ) -> ToolCall:
        arguments, error = parse_arguments(raw_arguments)
        key = key_from_text(name, raw_arguments)
        return cls(id, name, raw_arguments, arguments, error, key, provider_id)

    @classmethod
    def from_arguments(cls, id: str, name: str, arguments: dict[str, Any]) -> ToolCall:
        return cls(id, name, canonical_json(arguments), arguments, None, call_key(name, arguments))

    @property
    def provider_call_id(self) -> str:
        """The id the provider gave the call (its `id` until Keel gave one of its own)."""
        return self.id if self.provider_id is None else self.provider_id


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
    estimated: bool | None = field(default=None, metadata=OMIT_EMPTY)
    """True: some of these tokens Keel counted itself (`keel.tokens.estimated_usage`), because
    the server reported none (a stream from llama-cpp-python's server, ADR 0065); None: every
    count is the provider's. A sum is estimated when any part of it is."""

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cached_input_tokens + other.cached_input_tokens,
            True if self.estimated or other.estimated else None,
        )

    @property
    def total(self) -> int:
        return self.input_tokens + self.output_tokens


@dataclass(frozen=True, slots=True)
class OutputSchema:
    """The shape a request's answer must have (keel/structured.py): each transport asks for it
    in its provider's own form."""

    name: str
    """Letters, digits, _ and -: every provider accepts it as a schema or tool name."""
    schema: dict[str, Any]
    """JSON Schema of the answer."""
    partial: bool = False
    """A synthesis turn's envelope: ``{"output": <the run's schema>, "gaps": [...]}``."""


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
    output: OutputSchema | None = None
    """The shape the answer must have, when the run asked for one; None: free text."""
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
    model: str | None = None
    """The model that answered, as the provider names it (``gen_ai.response.model`` in traces;
    never stored or sent back)."""

    @property
    def is_empty(self) -> bool:
        return not self.tool_calls and not (self.text and self.text.strip())

    @property
    def cut_off(self) -> bool:
        """It was stopped at its output-token limit or by the model timeout: the text may end
        mid-sentence."""
        return self.stop_reason in CUT_OFF_REASONS


CUT_OFF_REASONS = frozenset({"length", "max_tokens", "max_output_tokens", "timeout"})
"""Stop reasons that mean "cut short": at the output limit (Chat Completions and llama.cpp say
``length``, Anthropic ``max_tokens``, the Responses API ``max_output_tokens``), or Keel's own
``timeout``, the answer a timed-out call had written so far (`keel.transports.liveness`)."""


def keel_call_id(step: int, index: int) -> str:
    """Keel's id for the `index`-th call (from 0) of the batch of step `step`: `k3_0`.

    Unique in a run, because a step accepts at most one batch (the first turn with calls) and
    step numbers only grow, across pauses and crashes too (each step's number is saved before
    its model turn is sent). Derived, not random, so the same run gives the same ids, and short
    enough to type (`keel approve RUN k3_0`)."""
    return f"k{step}_{index}"


def with_keel_ids(response: ModelResponse, step: int) -> ModelResponse:
    """The response with Keel's own id on each call, the provider's kept beside it."""
    if not response.tool_calls:
        return response
    calls = tuple(
        replace(call, id=keel_call_id(step, n), provider_id=call.provider_call_id)
        for n, call in enumerate(response.tool_calls)
    )
    return replace(response, tool_calls=calls)


def wire_call_ids(items: Iterable[Item]) -> dict[str, str]:
    """For each call of a request, by Keel's id, the id to send the provider for it.

    The provider's own id, unless an earlier call of the request already went out under it
    (a provider that repeats ids within a turn or across turns, or sends none): then Keel's id,
    suffixed until it is unused. So every call and its result pair up under an id no other
    call of the request has, which providers require. Only earlier calls decide a call's wire
    id, so what a request sent stays byte for byte the same in the next one (prompt caches)."""
    used: set[str] = set()
    wire: dict[str, str] = {}
    for item in items:
        if not isinstance(item, AssistantMessage):
            continue
        for call in item.tool_calls:
            chosen = call.provider_call_id
            if not chosen or chosen in used:
                chosen, n = call.id, 1
                while chosen in used:
                    chosen, n = f"{call.id}_{n}", n + 1
            used.add(chosen)
            wire[call.id] = chosen
    return wire


def digest_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
