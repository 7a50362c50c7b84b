"""The OpenTelemetry SDK installed in this process with an in-memory exporter, recording only
while `SWITCH.on` is set: for the telemetry tests and `benchmarks/observability.py`.

OpenTelemetry allows one tracer provider per process, so it is installed once and switched on
and off around what should be recorded; the rest of a test session runs untraced.
"""

from __future__ import annotations

from typing import Any, Literal

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult

__all__ = ["EXPORTER", "SWITCH", "Switch", "install"]


class Switch(Sampler):
    """Records every span while `on`, none otherwise (a dropped span costs what no SDK does)."""

    on = False

    def should_sample(
        self,
        parent: Any,
        trace_id: int,
        name: str,
        kind: Any = None,
        attributes: Any = None,
        *rest: Any,
    ) -> SamplingResult:
        if not self.on:
            return SamplingResult(Decision.DROP)
        return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes)

    def get_description(self) -> str:
        return "Switch"


SWITCH = Switch()
EXPORTER = InMemorySpanExporter()


def install(processor: Literal["simple", "batch"] = "simple") -> TracerProvider:
    """The process's SDK provider, sampling with `SWITCH` into `EXPORTER`; installed with the
    given span processor on the first call, the one already installed on later calls."""
    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):
        return current
    provider = TracerProvider(sampler=SWITCH, shutdown_on_exit=False)
    if processor == "batch":
        provider.add_span_processor(BatchSpanProcessor(EXPORTER))
    else:
        provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
    trace.set_tracer_provider(provider)
    return provider
