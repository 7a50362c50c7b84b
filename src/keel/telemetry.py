"""OpenTelemetry spans for a run, following the GenAI semantic conventions.

    invoke_agent keel            the run (a resumed run: a new one, child of the first, same trace;
                                 a sub-agent's run is named after its agent: invoke_agent reader)
    ├── chat MODEL               each model attempt, retries and synthesis turns included
    └── execute_tool NAME        each tool call that got a result, run or answered without running

Spans go to the tracer provider the application configured (`opentelemetry-api` alone is a
no-op, and then Keel does nothing at all per step). A `RunTrace` watches one run from outside
its loop: it is a listener of the run's typed events, plus two thin hooks the loop calls around
a model attempt (`traced_attempt`) and a tool's own work (`traced_tool`, both in
`keel/trace_hooks.py`, which the run imports without OpenTelemetry), so those spans are
current while the provider or the tool runs (an MCP call carries the trace on to its server).

Content (the question, answers, tool arguments and results) is recorded only when asked for:
`Agent(trace_content=True)`, `keel run --otel-content`, or the GenAI convention's
OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true. Without it a span holds counts, names,
ids and digests only; a call key (which holds the arguments) appears as its digest.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any, Protocol

from opentelemetry import context, trace
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.semconv.attributes.error_attributes import ERROR_TYPE
from opentelemetry.semconv.attributes.server_attributes import SERVER_ADDRESS, SERVER_PORT
from opentelemetry.trace import SpanKind, Status, StatusCode

from keel.errors import ProviderError
from keel.messages import ModelResponse, ToolCall, digest_text
from keel.records import (
    ApprovalRequested,
    Event,
    EvidenceReset,
    JsonObject,
    ModelRequestSent,
    ResultElided,
    ToolCallRequested,
    ToolResultRecorded,
)
from keel.result import RunResult
from keel.trace_hooks import ACTIVE, CONTENT_ENV, capture_content, traced_attempt, traced_tool

__all__ = [
    "CONTENT_ENV",
    "RunTrace",
    "RunView",
    "capture_content",
    "traced_attempt",
    "traced_tool",
]

AGENT_NAME = "keel"
SETTINGS_KEY = "trace"
"""Where a run's settings keep its first span's ids, so a resumed run joins the same trace."""

_log = logging.getLogger("keel.telemetry")
_OP = gen_ai.GenAiOperationNameValues
INVOKE_AGENT, CHAT, EXECUTE_TOOL = (
    _OP.INVOKE_AGENT.value,
    _OP.CHAT.value,
    _OP.EXECUTE_TOOL.value,
)


class RunView(Protocol):
    """What an observer may read of a live run besides its events, read-only: the run loop
    hands one over (`RunLoop.view`), so observers never reach into the loop's parts."""

    @property
    def run_id(self) -> str: ...

    @property
    def step(self) -> int: ...

    def call_count(self, call_key: str) -> int:
        """The identical-call counter of a key, as the breaker has it now."""
        ...

    def was_denied(self, call_id: str, call_key: str) -> bool:
        """A person denied this call, or an identical one earlier in the run."""
        ...


def provider_name(model: str) -> str:
    """gen_ai.provider.name from a model spec: the well-known names, else Keel's own."""
    scheme = model.removeprefix("xml:").partition(":")[0]
    return {
        "openai": "openai",
        "openai-chat": "openai",
        "anthropic": "anthropic",
    }.get(scheme, f"keel.{scheme or 'custom'}")


def _request_model(model: str) -> str:
    return model.removeprefix("xml:").partition(":")[2] or model


class RunTrace:
    """The spans of one run. Built by `begin`, which is None when nothing records them."""

    def __init__(
        self,
        tracer: trace.Tracer,
        root: trace.Span,
        model: str,
        content: bool,
        server: tuple[str, int] | None = None,
    ) -> None:
        self.tracer = tracer
        self.root = root
        self.content = content
        self._chat_name = f"{CHAT} {_request_model(model)}"
        self._chat_attributes: dict[str, Any] = {
            gen_ai.GEN_AI_OPERATION_NAME: CHAT,
            gen_ai.GEN_AI_PROVIDER_NAME: provider_name(model),
            gen_ai.GEN_AI_REQUEST_MODEL: _request_model(model),
            **_server_attributes(server),
        }
        self._request: ModelRequestSent | None = None
        self._calls: dict[str, ToolCallRequested] = {}
        self._running: dict[str, tuple[trace.Span, int]] = {}
        """Tool spans whose work is done, by call id, with their end time: the result ends them."""
        self._view: RunView | None = None

    @classmethod
    def begin(
        cls,
        run_id: str,
        model: str,
        question: str,
        *,
        settings: Mapping[str, Any] | None = None,
        content: bool = False,
        server: tuple[str, int] | None = None,
        agent: str | None = None,
    ) -> RunTrace | None:
        """Start the run's span; `settings`: a resumed run's saved settings (its trace);
        `server`: the host and port the model's requests go to (`transports.base.server_of`);
        `agent`: a sub-agent's name, which names its run's span (else `keel`)."""
        name = agent or AGENT_NAME
        tracer = trace.get_tracer("keel")
        parent = _saved_parent(settings)
        attributes: dict[str, Any] = {
            gen_ai.GEN_AI_OPERATION_NAME: INVOKE_AGENT,
            gen_ai.GEN_AI_AGENT_NAME: name,
            gen_ai.GEN_AI_CONVERSATION_ID: run_id,
            gen_ai.GEN_AI_PROVIDER_NAME: provider_name(model),
            gen_ai.GEN_AI_REQUEST_MODEL: _request_model(model),
            "keel.run_id": run_id,
            "keel.resumed": settings is not None,
            **_server_attributes(server),
        }
        if content and settings is None:
            attributes[gen_ai.GEN_AI_INPUT_MESSAGES] = _messages("user", question)
        root = tracer.start_span(
            f"{INVOKE_AGENT} {name}", context=parent, attributes=attributes
        )
        if not root.is_recording():
            return None
        return cls(tracer, root, model, content, server)

    def settings(self) -> JsonObject:
        """Saved with a new run, so its resumption continues this trace."""
        ctx = self.root.get_span_context()
        return {
            SETTINGS_KEY: {
                "trace_id": trace.format_trace_id(ctx.trace_id),
                "span_id": trace.format_span_id(ctx.span_id),
            }
        }

    async def run(self, advance: Callable[[], Awaitable[RunResult]], view: RunView) -> RunResult:
        """Run the loop (`advance`) with this trace current: the hooks find it, the run's span
        is the parent of everything inside; `view` answers what events do not carry."""
        self._view = view
        token = ACTIVE.set(self)
        try:
            with trace.use_span(self.root, record_exception=False, set_status_on_exception=False):
                result = await advance()
        except BaseException as exc:
            self._end_all(type(exc).__qualname__)
            raise
        finally:
            ACTIVE.reset(token)
        self._end_all(None, result)
        return result

    # -- the listener ---------------------------------------------------------------------------

    def __call__(self, event: Event) -> None:
        try:
            self._on(event)
        except Exception:  # tracing must never break a run
            _log.debug("could not record a span for %s", event.type, exc_info=True)

    def _on(self, event: Event) -> None:
        match event:
            case ModelRequestSent():
                self._request = event
            case ToolCallRequested() if self.content:
                self._calls[event.call_id] = event
            case ToolResultRecorded():
                self._tool_result(event)
            case ApprovalRequested():
                self.root.add_event("keel.approval_requested", {"gen_ai.tool.name": event.name})
            case EvidenceReset():
                self.root.add_event("keel.evidence_reset", {"keel.resets": event.resets})
            case ResultElided():
                self.root.add_event("keel.result_elided", {"keel.size": event.size})

    # -- chat: one model attempt ----------------------------------------------------------------

    async def attempt(self, attempt: Awaitable[ModelResponse]) -> ModelResponse:
        request = self._request
        attributes = {**self._chat_attributes, **self._run_attributes()}
        if request is not None:
            attributes["keel.attempt"] = request.attempt
            if request.synthesis is not None:
                attributes["keel.synthesis"] = request.synthesis
        span = self.tracer.start_span(self._chat_name, kind=SpanKind.CLIENT, attributes=attributes)
        token = context.attach(trace.set_span_in_context(span))
        try:
            response = await attempt
        except ProviderError as error:
            _failed(span, str(error.status) if error.status else type(error).__name__)
            raise
        except BaseException as exc:
            _failed(span, type(exc).__qualname__)
            raise
        finally:
            context.detach(token)
        usage = response.usage
        answered: dict[str, Any] = {
            gen_ai.GEN_AI_USAGE_INPUT_TOKENS: usage.input_tokens,
            gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS: usage.output_tokens,
            gen_ai.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: usage.cached_input_tokens,
        }
        if response.response_id:
            answered[gen_ai.GEN_AI_RESPONSE_ID] = response.response_id
        if response.model:
            answered[gen_ai.GEN_AI_RESPONSE_MODEL] = response.model
        if response.stop_reason:
            answered[gen_ai.GEN_AI_RESPONSE_FINISH_REASONS] = (response.stop_reason,)
        if self.content:
            answered[gen_ai.GEN_AI_OUTPUT_MESSAGES] = _output(response)
        span.set_attributes(answered)
        span.end()
        return response

    # -- execute_tool: one tool call ------------------------------------------------------------

    @contextlib.contextmanager
    def tool_work(self, call: ToolCall) -> Iterator[None]:
        span = self.tracer.start_span(
            f"{EXECUTE_TOOL} {call.name}", attributes=self._tool_attributes(call)
        )
        token = context.attach(trace.set_span_in_context(span))
        try:
            yield
        finally:
            context.detach(token)
            self._running[call.id] = (span, time.time_ns())

    def _tool_attributes(self, call: ToolCall | ToolResultRecorded) -> dict[str, Any]:
        name, call_id = call.name, (call.id if isinstance(call, ToolCall) else call.call_id)
        return {
            gen_ai.GEN_AI_OPERATION_NAME: EXECUTE_TOOL,
            gen_ai.GEN_AI_TOOL_NAME: name,
            gen_ai.GEN_AI_TOOL_CALL_ID: call_id,
            gen_ai.GEN_AI_TOOL_TYPE: "function",
            **self._run_attributes(),
        }

    def _tool_result(self, event: ToolResultRecorded) -> None:
        running = self._running.pop(event.call_id, None)
        if running is None:  # answered without running: denied, refused, invalid, unknown
            now = time.time_ns()
            span = self.tracer.start_span(
                f"{EXECUTE_TOOL} {event.name}",
                attributes=self._tool_attributes(event),
                start_time=now,
            )
            end = now
        else:
            span, end = running
        attributes: dict[str, Any] = {
            "keel.step": event.step,
            "keel.call_key": digest_text(event.call_key)[:16],
            "keel.uncertain": event.uncertain,
            "keel.dispatched": running is not None,
        }
        if self._view is not None:
            attributes["keel.call_count"] = self._view.call_count(event.call_key)
        if self.content:
            requested = self._calls.get(event.call_id)
            if requested is not None:
                attributes[gen_ai.GEN_AI_TOOL_CALL_ARGUMENTS] = _json(requested.arguments)
            attributes[gen_ai.GEN_AI_TOOL_CALL_RESULT] = event.content
        if event.is_error:
            attributes[ERROR_TYPE] = self._tool_error(event, running is not None)
            span.set_status(Status(StatusCode.ERROR))
        span.set_attributes(attributes)
        span.end(end_time=end)

    def _tool_error(self, event: ToolResultRecorded, dispatched: bool) -> str:
        if event.uncertain:
            return "keel.effect_unknown"
        view = self._view
        if not dispatched and view is not None and view.was_denied(event.call_id, event.call_key):
            return "keel.denied"
        return "keel.tool_error"

    # -- the run's end --------------------------------------------------------------------------

    def _run_attributes(self) -> dict[str, Any]:
        view = self._view
        if view is None:
            return {}
        return {"keel.run_id": view.run_id, "keel.step": view.step}

    def _end_all(self, error: str | None, result: RunResult | None = None) -> None:
        """End what is still open: tool spans a cancelled run left, then the run's span."""
        for span, end in self._running.values():
            _failed(span, error or "cancelled", end)
        self._running.clear()
        root = self.root
        if result is not None:
            root.set_attributes(
                {
                    "keel.status": result.status,
                    "keel.model_calls": result.model_calls,
                    "keel.tool_calls": result.tool_calls,
                    gen_ai.GEN_AI_USAGE_INPUT_TOKENS: result.usage.input_tokens,
                    gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS: result.usage.output_tokens,
                }
            )
            if result.synthesized:
                root.set_attribute("keel.synthesis", result.synthesized)
            if result.evidence is not None:  # the answer checked against the record (ADR 0053)
                root.set_attributes(_evidence_attributes(result.evidence))
            if result.failure is not None:
                error = result.failure.kind
            if self.content and result.answer is not None:
                root.set_attribute(
                    gen_ai.GEN_AI_OUTPUT_MESSAGES, _messages("assistant", result.answer)
                )
        if error is not None:
            _failed(root, error)
        else:
            root.end()


def _evidence_attributes(evidence: dict[str, Any]) -> dict[str, Any]:
    """The answer's citations checked, as span attributes named after the stored `evidence`
    object, which keeps its name (ADR 0058): a query over older traces still finds them."""
    return {
        "keel.evidence.cited": len(evidence.get("cited") or ()),
        "keel.evidence.quotes_checked": int(evidence.get("quotes_checked") or 0),
        "keel.evidence.quotes_failed": len(evidence.get("quotes_failed") or ()),
        "keel.evidence.unknown_ids": tuple(str(i) for i in evidence.get("unknown_ids") or ()),
        "keel.evidence.uncited_sentences": int(evidence.get("uncited_sentences") or 0),
        "keel.evidence.passed": bool(evidence.get("passed")),
    }


def _server_attributes(server: tuple[str, int] | None) -> dict[str, Any]:
    """``server.address`` and ``server.port``, recommended on GenAI client spans."""
    if server is None:
        return {}
    return {SERVER_ADDRESS: server[0], SERVER_PORT: server[1]}


def _failed(span: trace.Span, error: str, end: int | None = None) -> None:
    span.set_attribute(ERROR_TYPE, error)
    span.set_status(Status(StatusCode.ERROR))
    span.end(end_time=end)


def _saved_parent(settings: Mapping[str, Any] | None) -> Any:
    """The first run's span as a remote parent, so a resumed run continues its trace."""
    saved = (settings or {}).get(SETTINGS_KEY)
    if not isinstance(saved, dict):
        return None
    try:
        context = trace.SpanContext(
            trace_id=int(saved["trace_id"], 16),
            span_id=int(saved["span_id"], 16),
            is_remote=True,
            trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
        )
    except (KeyError, TypeError, ValueError):
        return None
    if not context.is_valid:
        return None
    return trace.set_span_in_context(trace.NonRecordingSpan(context))


def _messages(role: str, text: str) -> str:
    return json.dumps([{"role": role, "parts": [{"type": "text", "content": text}]}])


def _output(response: ModelResponse) -> str:
    parts: list[dict[str, Any]] = []
    if response.text:
        parts.append({"type": "text", "content": response.text})
    for call in response.tool_calls:
        parts.append(
            {"type": "tool_call", "id": call.id, "name": call.name, "arguments": call.arguments}
        )
    message = {"role": "assistant", "parts": parts, "finish_reason": response.stop_reason}
    return json.dumps([message], ensure_ascii=False, default=str)


def _json(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
