"""Text as the model writes it (ADR 0039): ephemeral deltas, never stored, never counted.

A transport that can stream offers `request_streaming(request, on_text)`: the same request
as `request` with the provider's stream flag, each piece of answer text handed to `on_text` as
it arrives, and the same `ModelResponse` at the end, built from the provider's own complete
answer (the Responses API's `response.completed`) or from the stream's pieces put together
the way the provider documents (Chat Completions chunks, Anthropic content blocks). So what
is recorded does not depend on whether someone listened. The run streams only when someone
listens for text (`agent.stream()`, `keel run --events`, `keel run` on a terminal); otherwise
it calls `request`, and nothing of this module runs (but for the Chat transport, which streams
every request to a server other than OpenAI's, to no listener: ADR 0065).

The events a listener hears are `TextDelta` (a piece of the text of one attempt of one step)
and `TextDiscarded` (that attempt failed after it streamed something: drop what it streamed;
the next attempt streams its own). A stream cut mid-way is a retryable ProviderError, like a
dropped connection.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

from keel.errors import ProviderError
from keel.messages import ModelRequest, ModelResponse

__all__ = [
    "OnText",
    "Streams",
    "TextDelta",
    "TextDiscarded",
    "TextEvent",
    "TextListener",
    "cut_short",
    "sse_events",
    "transport_errors",
]

OnText = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class TextDelta:
    """A piece of the text the model is writing in attempt `attempt` of step `step`."""

    text: str
    step: int
    attempt: int
    type: ClassVar[str] = "text_delta"

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "text": self.text, "step": self.step, "attempt": self.attempt}


@dataclass(frozen=True, slots=True)
class TextDiscarded:
    """Attempt `attempt` of step `step` failed after streaming text: drop that text."""

    step: int
    attempt: int
    type: ClassVar[str] = "text_discarded"

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "step": self.step, "attempt": self.attempt}


TextEvent = TextDelta | TextDiscarded
TextListener = Callable[[TextEvent], None]


@runtime_checkable
class Streams(Protocol):
    """A transport that can stream its answer's text."""

    streams: bool
    """False: it could, but is not set up to (a script without ``stream_ms``)."""

    async def request_streaming(self, request: ModelRequest, on_text: OnText) -> ModelResponse:
        """`request`, with each piece of text handed to `on_text` as it arrives."""


async def sse_events(lines: AsyncIterator[str], provider: str) -> AsyncIterator[dict[str, Any]]:
    """The JSON objects of a server-sent event stream's `data:` fields, in order ("[DONE]"
    ends it). A field that is not a JSON object fails the attempt, not retried."""
    data: list[str] = []
    async for line in lines:
        if line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
            continue
        if line or not data:
            continue
        text, data = "\n".join(data), []
        if text == "[DONE]":
            return
        yield _object(text, provider)
    if data and "\n".join(data) != "[DONE]":
        yield _object("\n".join(data), provider)


def _object(text: str, provider: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise ProviderError(f"{provider}: a stream event is not a JSON object: {text[:200]!r}")
    return value


async def cut_short(
    read: Callable[[], Awaitable[ModelResponse | None]], provider: str
) -> ModelResponse:
    """`read()`'s response; a stream that breaks, or ends before the answer is complete
    (None), is a retryable ProviderError."""
    try:
        response = await read()
    except transport_errors() as exc:
        raise ProviderError(
            f"{provider}: the stream was cut: {type(exc).__name__}: {exc}", retryable=True
        ) from None
    if response is None:
        raise ProviderError(
            f"{provider}: the stream ended before the answer was complete", retryable=True
        )
    return response


def transport_errors() -> tuple[type[Exception], ...]:
    """What a broken connection raises under the SDKs: ``httpx2``'s errors (the SDKs of this
    generation run on it) and ``httpx``'s (an injected client's, bridged), which are not
    related. Both are loaded already by the transport that streams, not by the run core
    (ADR 0042)."""
    import httpx
    import httpx2

    return (httpx.TransportError, httpx2.TransportError)
