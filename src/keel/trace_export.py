"""Exporting a process's spans: an OpenTelemetry SDK tracer provider that sends them over
OTLP/HTTP (or to stderr with ``OTEL_TRACES_EXPORTER=console``), for `keel run --otel` and the
processes that advance runs for others, `keel serve` and `keel worker` (ADR 0023, 0065). The
SDK is imported only when export is on."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from keel.errors import ConfigError

__all__ = ["EXPORT_ENV", "start_export"]

EXPORT_ENV = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
"""Either turns export on without `--otel`, as OpenTelemetry's own tools do."""


def start_export(enabled: bool) -> Callable[[], None] | None:
    """With `--otel` or an OTLP endpoint in the environment: install an SDK tracer provider
    that exports spans over OTLP/HTTP (or to stderr with OTEL_TRACES_EXPORTER=console).
    Returns what flushes and stops it at the end; None when export is off."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if not (enabled or any(os.environ.get(name) for name in EXPORT_ENV)):
        return None
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            ConsoleSpanExporter,
            SpanExporter,
        )
    except ImportError:
        raise ConfigError(
            "--otel needs the OpenTelemetry SDK and exporter: pip install 'keel-runtime[otel]'"
        ) from None
    exporter: SpanExporter
    if os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "console":
        exporter = ConsoleSpanExporter(out=sys.stderr)
    else:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            raise ConfigError(
                "--otel needs the OTLP exporter: pip install 'keel-runtime[otel]'"
            ) from None
        exporter = OTLPSpanExporter()
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", "keel")})
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return provider.shutdown
