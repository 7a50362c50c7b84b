"""One model turn: build the request for the current mode, call, retry, and the empty-turn rule.

Every attempt is a model call against the budget, so the mode is decided again before each
attempt: a retry of a synthesis turn stays synthesis-only, and a normal turn whose retries leave
one call in the budget becomes budget synthesis.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

from keel._run import gateway, hooks
from keel._run.breaker import repeated_tools
from keel._run.budgets import next_call_cost, out_of_time, output_limit, past_limits, running_out
from keel._run.parts import StepParts
from keel._run.synthesis import (
    PARTIAL_OUTPUT_CONTROL,
    Mode,
    context_mode,
    decide_mode,
    nudge_control,
    with_question,
)
from keel.errors import (
    ContextExhausted,
    ContextOverflow,
    DeadlineExceeded,
    EmptyModelTurn,
    ModelError,
    ProviderError,
)
from keel.failpoints import failpoint
from keel.inbound import clean_response, clean_text
from keel.messages import ModelRequest, ModelResponse, with_keel_ids
from keel.pricing import call_cost
from keel.records import (
    ContextShrunk,
    ModelErrorSeen,
    ModelRequestSent,
    ModelResponseReceived,
    RecordedCall,
    ToolChoiceIgnored,
)
from keel.trace_hooks import traced_attempt
from keel.transports.base import SteersFirstCall

__all__ = ["current_mode", "next_turn"]


def current_mode(parts: StepParts) -> Mode:
    """Step 2, asked again before every attempt: a retry may only move toward synthesis. The
    first turn insists on a tool call when the run asks for it and offers tools; a transport
    that steers its model's first call (`SteersFirstCall`) names the call to start with."""
    tokens = parts.context.total_tokens
    cost = next_call_cost(parts.state, parts.price, tokens, output_limit(parts.transport))
    budget = running_out(parts.state, parts.limits, tokens, cost)
    insist = (
        parts.limits.first_turn_tool is True and parts.state.step == 1 and bool(parts.context.tools)
    )
    repeating = parts.breaker.synthesis_key() if parts.limits.repeat_synthesis else None
    late = out_of_time(parts.state, parts.limits, parts.clock)
    start = None
    if insist and isinstance(parts.transport, SteersFirstCall):
        tools = {t.name for t in parts.context.tools}
        start = parts.transport.first_call(parts.context.question(), tools)
    mode = decide_mode(repeating, budget, insist_on_tool=insist, out_of_time=late, first_call=start)
    if mode.reason is None and parts.limits.nudge:  # docs/adr/0050: volatile, never stored
        nudged = parts.breaker.nudge_key()
        if nudged is not None:
            mode = replace(mode, controls=(*mode.controls, nudge_control(repeated_tools(nudged))))
    return mode if mode.reason is None else with_question(mode, parts.context.question())


async def next_turn(parts: StepParts) -> tuple[ModelResponse, Mode]:
    """A response with text or tool calls, and the mode it was asked in."""
    state, limits = parts.state, parts.limits
    policy = gateway.RetryPolicy(
        limits.model_retries, limits.retry_base_delay, limits.retry_max_delay
    )
    errors = empty = overflows = 0
    last_was_empty = False
    while True:
        stop = past_limits(state, limits, parts.clock)
        if stop is not None:
            raise stop
        mode = current_mode(parts)
        if overflows >= 2:  # refused as too long twice: answer from what fits
            mode = context_mode(mode, parts.context.question())
        request, mode = _fitted_request(parts, mode, squeeze=overflows >= 2)
        synthesis = mode.reason is not None
        if parts.output is not None:  # each transport asks for it in its provider's form
            request = replace(request, output=parts.output.request(synthesis))
        request = await hooks.before_model(parts, request, synthesis)
        number = errors + empty + 1 + overflows
        parts.recorder.emit(
            ModelRequestSent(
                step=state.step,
                attempt=number,
                tool_choice=request.tool_choice,
                synthesis=mode.reason,
                items=len(request.items),
                estimated_input_tokens=request.estimated_input_tokens,
                repeated_prefix_tokens=request.repeated_prefix_tokens,
            )
        )
        await parts.checkpoint()  # the step so far, and this attempt, before it is sent
        failpoint("after_checkpoint")
        started = time.monotonic()
        live = parts.live
        transport = parts.transport if live is None else live.attempt(state.step, number)
        try:
            attempt = gateway.attempt(transport, request, limits, parts.clock.remaining())
            response = clean_response(await traced_attempt(attempt), _secret(parts))
        except ContextOverflow as error:  # sent again smaller, never as it was (issue 44)
            if live is not None:
                live.failed(state.step, number)
            _remember_transport(parts)
            overflows += 1
            _after_overflow(parts, error, request, overflows)
            continue
        except ProviderError as error:
            if live is not None:
                live.failed(state.step, number)  # drop what the failed attempt streamed
            _remember_transport(parts)
            errors += 1
            last_was_empty = False
            await _after_error(parts, policy, error, errors)
            continue
        _remember_transport(parts)
        took = time.monotonic() - started  # what the deadline reserve is estimated from
        response = with_keel_ids(response, state.step)  # before anything records its calls
        if parts.hooks is not None:  # what the run records and acts on, its calls Keel's
            response = with_keel_ids(
                await hooks.after_model(parts, response, synthesis), state.step
            )
        cost = None if parts.price is None else call_cost(response.usage, parts.price)
        parts.recorder.emit(_response_event(state.step, response, cost, took))  # spend: ledger
        failpoint("after_model_response")
        if not response.is_empty:
            state.evidence_feedback = None  # the turn it was for is answered
            if request.tool_choice == "required" and not response.tool_calls:
                # the server ignored it: never pass the answer off as researched (ADR 0036)
                parts.recorder.emit(ToolChoiceIgnored(step=state.step, requested="required"))
            return response, mode
        empty += 1
        if empty >= 2:
            how = "twice in a row" if last_was_empty else "twice in this turn's attempts"
            raise EmptyModelTurn(
                f"the model returned an empty turn (no text, no tool calls) {how}",
                step=state.step,
                details={"attempts": empty},
            )
        last_was_empty = True


def _controls(parts: StepParts, mode: Mode) -> tuple[str, ...]:
    controls = mode.controls
    if parts.output is not None and mode.reason is not None:
        controls += (PARTIAL_OUTPUT_CONTROL,)
    if parts.state.evidence_feedback is not None:  # `--citations require`'s one more turn
        controls += (parts.state.evidence_feedback,)
    return controls


def _fitted_request(parts: StepParts, mode: Mode, *, squeeze: bool) -> tuple[ModelRequest, Mode]:
    """The next request, inside the model's window (issue 44): the context builder elides and
    clamps to fit; when even that does not fit, the turn answers from what fits (a context
    synthesis turn, the latest batch elided too); when not even that fits, the run ends
    ContextExhausted, never with a request the provider must refuse."""
    context = parts.context
    request, elided = context.build(mode.tool_choice, _controls(parts, mode), squeeze=squeeze)
    if not context.fits(request):
        mode = context_mode(mode, context.question())
        request, more = context.build(mode.tool_choice, _controls(parts, mode), squeeze=True)
        elided += more
    parts.recorder.elided(elided)
    parts.recorder.clamped(context.take_clamps())
    if not context.fits(request):
        room = max(context.limit or 0, context.ceiling or 0)
        raise ContextExhausted(
            f"the question and the run's own turns come to ~{request.estimated_input_tokens:,} "
            f"tokens with every result elided, more than the model's window leaves for a "
            f"request (~{room:,})",
            step=parts.state.step,
            details={"tokens": request.estimated_input_tokens, "limit": room},
        )
    return request, mode


def _after_overflow(
    parts: StepParts, error: ContextOverflow, request: ModelRequest, overflows: int
) -> None:
    """The provider refused the request as too long: the first time the turn is sent again
    from a smaller context, the second time as a synthesis turn from what fits; the third
    ends the run ContextExhausted, naming the window."""
    state = parts.state
    parts.recorder.emit(
        ModelErrorSeen(
            step=state.step,
            status=error.status,
            retryable=False,
            message=clean_text(error.message),
            retry_in=0.0 if overflows <= 2 else None,
        )
    )
    sent = request.estimated_input_tokens
    if overflows > 2:
        window = f"its window of {error.limit:,} tokens" if error.limit else "its window"
        raise ContextExhausted(
            f"the model refused the turn as longer than {window} even as a synthesis turn "
            f"from a smaller context (~{sent:,} tokens): {clean_text(error.message)}",
            step=state.step,
            details={"window": error.limit, "requested": error.requested, "sent": sent},
        )
    limit = parts.context.shrink(sent, error.limit, error.requested)
    parts.recorder.emit(ContextShrunk(step=state.step, sent=sent, limit=limit, window=error.limit))


def _secret(parts: StepParts) -> str | None:
    """The API key the run's transport sends: scrubbed from its answers before anything keeps
    them (ADR 0048)."""
    return parts.keyed.secret() if parts.keyed is not None else None


def _remember_transport(parts: StepParts) -> None:
    """A deterministic transport's position is part of the checkpoint."""
    if parts.resumable is not None:
        parts.state.transport = parts.resumable.snapshot()


async def _after_error(
    parts: StepParts, policy: gateway.RetryPolicy, error: ProviderError, retries: int
) -> None:
    state = parts.state
    retry = error.retryable and retries <= policy.retries
    delay = policy.delay(retries, error.retry_after) if retry else None
    parts.recorder.emit(
        ModelErrorSeen(
            step=state.step,
            status=error.status,
            retryable=error.retryable,
            message=clean_text(error.message),
            retry_in=delay,
        )
    )
    remaining = parts.clock.remaining()
    if remaining is not None and (remaining <= 0 or (delay or 0) >= remaining):
        raise DeadlineExceeded(
            f"the run reached its deadline of {parts.limits.deadline:g}s while the model was "
            f"failing ({clean_text(error.message)})",
            step=state.step,
            details={"deadline": parts.limits.deadline},
        )
    if delay is None:
        what = "failed" if not error.retryable else f"kept failing after {retries} attempts"
        raise ModelError(
            f"the model call {what}: {clean_text(error.message)}",
            step=state.step,
            details={"status": error.status, "retryable": error.retryable},
        )
    await asyncio.sleep(delay)


def _response_event(
    step: int, response: ModelResponse, cost: float | None, took: float
) -> ModelResponseReceived:
    return ModelResponseReceived(
        step=step,
        text=response.text,
        tool_calls=tuple(
            RecordedCall(c.id, c.name, c.raw_arguments, c.provider_id) for c in response.tool_calls
        ),
        usage=response.usage,
        stop_reason=response.stop_reason,
        empty=response.is_empty,
        provider_details=response.provider_details,
        cost=cost,
        took=round(took, 6),
    )
