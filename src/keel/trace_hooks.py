"""What the run calls for tracing, without importing OpenTelemetry: the two thin hooks around a
model attempt and a tool's own work, the content switch, and whether anything could record a
span at all. `keel.telemetry` (which imports the OpenTelemetry API) is imported only for a run
that may be traced, so a run nobody traces starts without it (ADR 0042)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Awaitable, Iterator
from contextlib import AbstractContextManager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from keel.messages import ModelResponse, ToolCall

__all__ = [
    "ACTIVE",
    "CONTENT_ENV",
    "Traced",
    "capture_content",
    "traced_attempt",
    "traced_tool",
    "tracing_possible",
]

CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"


class Traced(Protocol):
    """The traced run the hooks hand their work to (`keel.telemetry.RunTrace`)."""

    async def attempt(self, attempt: Awaitable[ModelResponse]) -> ModelResponse: ...

    def tool_work(self, call: ToolCall) -> AbstractContextManager[None]: ...


ACTIVE: ContextVar[Traced | None] = ContextVar("keel_run_trace", default=None)
"""The trace of the run being advanced in this context, set by `RunTrace.run`."""


def capture_content(asked: bool | None = None) -> bool:
    if asked is not None:
        return asked
    return os.environ.get(CONTENT_ENV, "").strip().lower() in ("1", "true", "yes")


def tracing_possible() -> bool:
    """Whether a span could be recorded: a tracer provider is set through the OpenTelemetry API,
    so the API is imported already, unless the environment names one for it to load."""
    return "opentelemetry.trace" in sys.modules or "OTEL_PYTHON_TRACER_PROVIDER" in os.environ


async def traced_attempt(attempt: Awaitable[ModelResponse]) -> ModelResponse:
    """One model attempt, inside a `chat` span when the run is traced."""
    run = ACTIVE.get()
    if run is None:
        return await attempt
    return await run.attempt(attempt)


@contextlib.contextmanager
def traced_tool(call: ToolCall) -> Iterator[None]:
    """A tool's own work, inside an `execute_tool` span when the run is traced; the span ends
    when the call's result is recorded."""
    run = ACTIVE.get()
    if run is None:
        yield
        return
    with run.tool_work(call):
        yield
