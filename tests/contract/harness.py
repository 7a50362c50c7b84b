"""The shared provider contract: what every transport must do with the same ModelRequest.

Each transport supplies a `ContractCase` (one module per transport, `case_<name>.py`). The suite in
`test_provider_contract.py` drives every case through the real SDK with an `httpx.MockTransport`
underneath, so what is checked is the SDK's real outgoing HTTP request and the parsing of real
response shapes, never an echo of our own mock.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Protocol

import httpx

from keel.messages import (
    AssistantMessage,
    Item,
    ModelRequest,
    ToolCall,
    ToolDefinition,
    ToolResult,
    UserMessage,
    digest_text,
)
from keel.transports.base import Transport

SYSTEM = "You are a careful research agent."
CONTROL = "No tools now: write the best supported answer and name the gaps."
TOOLS = (
    ToolDefinition(
        "fetch",
        "Download a web page as text.",
        {"type": "object", "properties": {"url": {"type": "string"}}, "required": ["url"]},
    ),
    ToolDefinition(
        "read_file",
        "Read a file of the repository.",
        {
            "type": "object",
            "properties": {"path": {"type": "string"}, "start_line": {"type": "integer"}},
            "required": ["path"],
        },
    ),
)
CALL_A = ToolCall.from_raw("call_a1", "fetch", '{"url": "https://example.org/spec"}')
CALL_B = ToolCall.from_raw("call_b2", "read_file", '{"path": "src/keel/loop.py"}')
RESULT_A_TEXT = "URL: https://example.org/spec\nStatus: 200\n\nThe loop checkpoints every step."
RESULT_B_TEXT = "1: from keel._run.breaker import IdenticalCallBreaker"
HISTORY: tuple[Item, ...] = (
    UserMessage("Which modules does the run loop depend on?"),
    AssistantMessage("Let me look.", (CALL_A, CALL_B)),
    ToolResult(
        CALL_A.id,
        CALL_A.name,
        CALL_A.key,
        RESULT_A_TEXT,
        size=len(RESULT_A_TEXT),
        digest=digest_text(RESULT_A_TEXT),
    ),
    ToolResult(
        CALL_B.id,
        CALL_B.name,
        CALL_B.key,
        RESULT_B_TEXT,
        is_error=True,
        size=len(RESULT_B_TEXT),
        digest=digest_text(RESULT_B_TEXT),
    ),
)


CACHE_KEY = "run_5e3a9c0d41b27f68"
"""The run's id, the provider cache key of every request of the run."""
SETTLED = 3
"""The history's first three items are settled (as if result A had been elided)."""


def ordinary_request() -> ModelRequest:
    return ModelRequest(
        SYSTEM,
        TOOLS,
        HISTORY,
        tool_choice=None,
        volatile=(),
        settled_items=SETTLED,
        cache_key=CACHE_KEY,
    )


def synthesis_request() -> ModelRequest:
    return ModelRequest(
        SYSTEM,
        TOOLS,
        HISTORY,
        tool_choice="none",
        volatile=(CONTROL,),
        settled_items=SETTLED,
        cache_key=CACHE_KEY,
    )


def required_request() -> ModelRequest:
    """A turn that insists on a tool call (``keel run --first-turn-tool``): the question only."""
    return ModelRequest(SYSTEM, TOOLS, HISTORY[:1], tool_choice="required")


class Recorder:
    """A fake provider under a transport's real SDK: answers each request with the next canned
    response and keeps the requests the SDK really sent (also used by the transport tests)."""

    def __init__(self, *responses: httpx.Response) -> None:
        self.responses = list(responses)
        self.sent: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request)
        return self.responses.pop(0)

    def http(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.MockTransport(self))

    def body(self, index: int = -1) -> dict[str, Any]:
        """The JSON body of a request sent (the last one by default)."""
        data: dict[str, Any] = json.loads(self.sent[index].content)
        return data


class ContractCase(Protocol):
    """What one transport supplies to the contract suite."""

    name: str
    required_choice: Any
    """The wire's ``tool_choice`` for a "required" request (OpenAI "required", Anthropic
    {"type": "any"}), or None where nothing is sent (the XML fallback)."""

    def make(self, http: httpx.AsyncClient) -> Transport:
        """The transport under test, its SDK client built on `http` (no retries of its own)."""

    def text_response(self) -> httpx.Response:
        """A real response shape: a plain text answer "The loop depends on the breaker." with
        usage 120 input (20 of them cached) / 9 output tokens."""

    def tool_calls_response(self) -> httpx.Response:
        """A real response shape with two tool calls: fetch {"url": "https://example.org/a"}
        (id "call_x1") and read_file {"path": "README.md"} (id "call_x2"), and usage."""

    def error_response(self, status: int) -> httpx.Response:
        """A real error body for `status`, with the message "simulated failure <status>"; 429
        carries a Retry-After of 7 seconds."""

    def check_ordinary(self, body: dict[str, Any]) -> None:
        """Assert, field by field, the wire payload of `ordinary_request()`: tools present,
        no tool_choice, history replayed intact (both calls, both results, ids paired, the error
        flag where the wire has one), system text, no control text, and the provider's prompt
        caching asked for (Anthropic: breakpoints; OpenAI: the run's `prompt_cache_key`)."""

    def check_synthesis(self, body: dict[str, Any]) -> None:
        """Assert the wire payload of `synthesis_request()`: the same tools and history, the
        provider's "none" tool choice, the same caching, and the control text appended last,
        after the last cache breakpoint."""


CaseFactory = Callable[[], ContractCase]
