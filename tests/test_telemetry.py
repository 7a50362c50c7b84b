"""OpenTelemetry spans of a run, read back with the SDK's in-memory exporter and named with the
constants of `opentelemetry-semantic-conventions`; and the command line's OTLP export across
a crash and a resume, received by a loopback collector."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.semconv.attributes.error_attributes import ERROR_TYPE

import keel
from keel.transports.openai_chat import from_wire
from otlp_collector import Collector
from support import call

OP = gen_ai.GenAiOperationNameValues
SYNTHESIS = {"text": "Best supported answer; research stopped because it was repeating."}


@keel.tool
def note(topic: str) -> str:
    """Read a note."""
    return f"NOTE-TEXT about {topic}"


@keel.tool(effect="side_effecting", requires_approval=True)
def publish(text: str) -> str:
    """Publish text."""
    raise AssertionError("denied calls never run")


def by_kind(found: tuple[ReadableSpan, ...]) -> dict[str, list[ReadableSpan]]:
    kinds: dict[str, list[ReadableSpan]] = {}
    for span in sorted(found, key=lambda s: s.start_time or 0):
        kinds.setdefault(str((span.attributes or {})[gen_ai.GEN_AI_OPERATION_NAME]), []).append(
            span
        )
    return kinds


def attr(span: ReadableSpan, key: str) -> Any:
    return (span.attributes or {}).get(key)


async def test_a_run_with_a_denial_and_a_synthesis_turn_produces_the_expected_span_tree(
    spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    script = keel.ScriptedTransport.from_dict(
        {
            "turns": [call("note", topic="x"), call("publish", text="hi"), call("note", topic="x")],
            "on_synthesis": SYNTHESIS,
        }
    )
    store = keel.Store(tmp_path / "runs.sqlite")
    agent = keel.Agent(
        script, tools=[note, publish], store=store, limits=keel.Limits(loop_threshold=3)
    )
    paused = await agent.arun("What do the notes say?")
    assert paused.status == "awaiting_approval"
    (asked,) = paused.pending_approvals
    assert asked.call_id == "k2_0"  # Keel's id for the call (ADR 0030), not the script's call_2
    agent.deny(paused.run_id, asked.call_id, reason="not now", by="ana")
    done = await agent.aresume(paused.run_id)
    assert done.status == "completed" and done.synthesized == "repeated_tool"

    kinds = by_kind(spans.get_finished_spans())
    first, second = kinds[OP.INVOKE_AGENT.value]
    chats, tools = kinds[OP.CHAT.value], kinds[OP.EXECUTE_TOOL.value]
    assert first.name == f"{OP.INVOKE_AGENT.value} keel"
    assert [c.name for c in chats] == [f"{OP.CHAT.value} {script.name.partition(':')[2]}"] * 4
    assert [t.name for t in tools] == [
        f"{OP.EXECUTE_TOOL.value} {n}" for n in ("note", "publish", "note")
    ]

    # one trace: the resumed run's span is a child of the first run's span
    assert {s.context.trace_id for s in spans.get_finished_spans()} == {first.context.trace_id}
    assert first.parent is None and second.parent is not None
    assert second.parent.span_id == first.context.span_id
    assert [c.parent.span_id for c in chats[:2]] == [first.context.span_id] * 2  # type: ignore[union-attr]
    assert [c.parent.span_id for c in chats[2:]] == [second.context.span_id] * 2  # type: ignore[union-attr]
    assert [t.parent.span_id for t in tools] == [  # type: ignore[union-attr]
        first.context.span_id,
        second.context.span_id,
        second.context.span_id,
    ]

    for run_span, status in ((first, "awaiting_approval"), (second, "completed")):
        assert attr(run_span, gen_ai.GEN_AI_AGENT_NAME) == "keel"
        assert attr(run_span, gen_ai.GEN_AI_CONVERSATION_ID) == paused.run_id
        assert attr(run_span, "keel.run_id") == paused.run_id
        assert attr(run_span, "keel.status") == status
    assert attr(first, "keel.resumed") is False and attr(second, "keel.resumed") is True
    assert attr(second, "keel.synthesis") == "repeated_tool"
    assert [e.name for e in first.events] == ["keel.approval_requested"]

    for chat in chats:
        assert attr(chat, gen_ai.GEN_AI_PROVIDER_NAME) == "keel.script"
        assert attr(chat, gen_ai.GEN_AI_REQUEST_MODEL) == script.name.partition(":")[2]
        assert attr(chat, gen_ai.GEN_AI_USAGE_INPUT_TOKENS) > 0
        assert attr(chat, gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS) >= 0
        assert attr(chat, gen_ai.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS) == 0
    assert [attr(c, "keel.step") for c in chats] == [1, 2, 3, 4]
    assert [attr(c, "keel.synthesis") for c in chats] == [None, None, None, "repeated_tool"]

    note1, denied, note2 = tools
    assert attr(denied, gen_ai.GEN_AI_TOOL_NAME) == "publish"
    assert attr(denied, gen_ai.GEN_AI_TOOL_CALL_ID) == "k2_0"
    assert attr(denied, ERROR_TYPE) == "keel.denied"
    assert attr(denied, "keel.dispatched") is False
    assert [attr(t, "keel.call_count") for t in (note1, note2)] == [1, 2]
    assert attr(note1, "keel.call_key") == attr(note2, "keel.call_key")
    assert [attr(t, "keel.uncertain") for t in tools] == [False, False, False]
    assert attr(note1, ERROR_TYPE) is None and attr(note1, "keel.dispatched") is True
    store.close()


async def test_no_prompt_or_result_text_in_spans_unless_asked(
    spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", raising=False)
    question, answer = "QUESTION-TEXT: what is x?", "ANSWER-TEXT about x."

    def dump() -> str:
        return json.dumps(
            [
                {
                    "name": s.name,
                    "attributes": dict(s.attributes or {}),
                    "events": [dict(e.attributes or {}) for e in s.events],
                }
                for s in spans.get_finished_spans()
            ],
            default=str,
        )

    for content in (False, True):
        spans.clear()
        script = keel.ScriptedTransport.from_dict(
            {"turns": [call("note", topic="TOPIC-ARG"), {"text": answer}]}
        )
        agent = keel.Agent(script, tools=[note], store=":memory:", trace_content=content)
        await agent.arun(question)
        text = dump()
        assert len(spans.get_finished_spans()) == 4  # the run, two chats, one tool call
        for secret in ("QUESTION-TEXT", "ANSWER-TEXT", "TOPIC-ARG", "NOTE-TEXT"):
            assert (secret in text) is content, (secret, content)
    run_span = by_kind(spans.get_finished_spans())[OP.INVOKE_AGENT.value][0]
    assert "QUESTION-TEXT" in attr(run_span, gen_ai.GEN_AI_INPUT_MESSAGES)
    tool_span = by_kind(spans.get_finished_spans())[OP.EXECUTE_TOOL.value][0]
    assert attr(tool_span, gen_ai.GEN_AI_TOOL_CALL_RESULT) == "NOTE-TEXT about TOPIC-ARG"


async def test_a_failed_model_attempt_is_a_chat_span_with_its_error_type(
    spans: InMemorySpanExporter,
) -> None:
    script = keel.ScriptedTransport.from_dict(
        {"turns": [{"error": {"status": 503, "message": "busy"}}, {"text": "ok"}]}
    )
    agent = keel.Agent(
        script, store=":memory:", limits=keel.Limits(retry_base_delay=0.001, retry_max_delay=0.01)
    )
    assert (await agent.arun("q")).status == "completed"
    failed, ok = by_kind(spans.get_finished_spans())[OP.CHAT.value]
    assert attr(failed, ERROR_TYPE) == "503" and attr(failed, "keel.attempt") == 1
    assert attr(ok, ERROR_TYPE) is None and attr(ok, "keel.attempt") == 2


def test_the_response_id_is_read_from_the_provider_for_the_chat_span() -> None:
    body = {
        "id": "chatcmpl-123",
        "choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}],
    }
    assert from_wire(body).response_id == "chatcmpl-123"


async def test_without_a_recording_provider_a_run_has_no_trace(tmp_path: Path) -> None:
    """Tracing off (no SDK, or not sampled): nothing is stored or created per step."""
    store = keel.Store(tmp_path / "runs.sqlite")
    agent = keel.Agent(keel.ScriptedTransport.from_dict({"turns": [{"text": "ok"}]}), store=store)
    result = await agent.arun("q")
    record = store.get_run(result.run_id)
    assert record is not None and "trace" not in record.config.settings
    store.close()


def test_a_crashed_and_resumed_run_continues_one_trace(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    turns = [
        call("list_files"),
        call("read_file", path="notes.md"),
        {"text": "The notes say leases expire."},
    ]
    script.write_text(json.dumps({"turns": turns, "latency_ms": 300}))
    (tmp_path / "notes.md").write_text("Leases expire.\n")
    store = tmp_path / "runs.sqlite"
    with Collector() as collector:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "KEEL_"))}
        env |= {"OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "20"}

        def keel_cli(*args: str, failpoints: str = "") -> subprocess.CompletedProcess[str]:
            extra = {"KEEL_FAILPOINTS": failpoints} if failpoints else {}
            return subprocess.run(
                [sys.executable, "-m", "keel", *args, "--store", str(store), "--json"],
                capture_output=True,
                text=True,
                timeout=120,
                env=env | extra,
            )

        killed = keel_cli(
            "run",
            "What do the notes say?",
            "--model",
            f"script:{script}",
            "--repo",
            str(tmp_path),
            failpoints="after_model_response:2",
        )
        assert killed.returncode == -9, killed.stderr
        before = list(collector.spans)
        db = keel.Store(store)
        (record,) = db.list_runs(1)
        saved = record.config.settings["trace"]
        db.close()
        resumed = keel_cli("resume", record.run_id)
        assert resumed.returncode == 0, resumed.stderr
    assert isinstance(saved, dict)
    assert before, "the first process exported its finished spans before it was killed"
    assert {s.trace_id for s in collector.spans} == {saved["trace_id"]}
    assert {s.parent_span_id for s in before} == {saved["span_id"]}
    roots = [s for s in collector.spans if s.attributes.get("keel.resumed") is True]
    assert len(roots) == 1 and roots[0].parent_span_id == saved["span_id"]
    assert roots[0].attributes["keel.status"] == "completed"
