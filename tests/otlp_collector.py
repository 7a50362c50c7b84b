"""A minimal OTLP/HTTP trace receiver on loopback, for tests that run `keel --otel` in a real
process: it decodes each export (protobuf) and keeps the spans."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from loopback_http import QuietHandler


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]


class Collector:
    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        lock = threading.Lock()
        spans = self.spans

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                with lock:
                    for resource in request.resource_spans:
                        for scope in resource.scope_spans:
                            spans.extend(_span(s) for s in scope.spans)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.reply(reply, "application/x-protobuf")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> Collector:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)


def _span(span: Any) -> ReceivedSpan:
    attributes = {a.key: _value(a.value) for a in span.attributes}
    return ReceivedSpan(
        span.name, span.trace_id.hex(), span.span_id.hex(), span.parent_span_id.hex(), attributes
    )


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None
