"""Writes two files with the OpenTelemetry Python SDK's own exporters, from one agent's trace
whose spans carry OpenInference's attributes (`openinference.span.kind` LLM and TOOL,
`tool.name`, `input.value`, `output.value`, `llm.model_name`):

    otel-console-openinference.txt   the SDK's `ConsoleSpanExporter` (what
                                     `OTEL_TRACES_EXPORTER=console` prints: each span as
                                     indented JSON, one after another)
    otel-otlp-openinference.json     the SDK's OTLP encoder (`encode_spans`, what the OTLP
                                     exporters send), printed as OTLP JSON by protobuf's
                                     `json_format`

The spans' content is this script's; their shape on disk is the SDK's.

    python tests/data/recordings/make_otel_console.py   # needs opentelemetry-sdk
"""

import json
import sys
from pathlib import Path

from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

OUT = Path(__file__).with_name("otel-console-openinference.txt")
OTLP = Path(__file__).with_name("otel-otlp-openinference.json")
QUERIES = ["JsonParser", "JsonParser class", "class JsonParser", "JsonParser.java", "parser"]


def main() -> None:
    with OUT.open("w") as out:
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(out=out)))
        memory = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(memory))
        tracer = provider.get_tracer("keel-tests")
        with tracer.start_as_current_span("agent", attributes={"openinference.span.kind": "AGENT"}):
            for n, query in enumerate(QUERIES):
                llm = {"openinference.span.kind": "LLM", "llm.model_name": "gpt-4o-mini"}
                with tracer.start_as_current_span("ChatCompletion", attributes=llm):
                    pass
                found = "No matches found." if n < 4 else "src/main/java/JsonParser.java"
                tool = {
                    "openinference.span.kind": "TOOL",
                    "tool.name": "find_file",
                    "input.value": json.dumps({"query": query}),
                    "output.value": found,
                }
                with tracer.start_as_current_span("find_file", attributes=tool):
                    pass
        provider.shutdown()
    request = encode_spans(memory.get_finished_spans())
    OTLP.write_text(json_format.MessageToJson(request) + "\n")
    sys.stdout.write(f"wrote {OUT} and {OTLP}\n")


if __name__ == "__main__":
    main()
