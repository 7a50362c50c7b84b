"""One model turn: build the request for the current mode, call, retry, and the empty-turn rule.

Every attempt is a model call against the budget, so the mode is decided again before each
attempt: a retry of a synthesis turn stays synthesis-only, and a normal turn whose retries leave
one call in the budget becomes budget synthesis.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from keel import gateway
from keel.errors import DeadlineExceeded, EmptyModelTurn, ModelError, ProviderError
from keel.failpoints import failpoint
from keel.messages import ModelResponse
from keel.synthesis import Mode

if TYPE_CHECKING:
    from keel.loop import RunLoop


class ModelTurns:
    def __init__(self, run: RunLoop) -> None:
        self.run = run
        self.policy = gateway.RetryPolicy(
            run.limits.model_retries, run.limits.retry_base_delay, run.limits.retry_max_delay
        )

    async def next_turn(self) -> tuple[ModelResponse, Mode]:
        """A response with text or tool calls, and the mode it was asked in."""
        run = self.run
        retries = empty = 0
        while True:
            run.check_stop()
            mode = run.mode()
            request, newly_elided = run.context.build(
                "none" if mode.reason else None, mode.controls
            )
            run.recorder.elided(newly_elided)
            run.state.model_calls += 1
            snapshot = getattr(run.transport, "snapshot", None)
            run.emit(
                "model_request",
                {
                    "step": run.state.step,
                    "attempt": retries + empty + 1,
                    "tool_choice": request.tool_choice,
                    "synthesis": mode.reason,
                    "items": len(request.items),
                    "estimated_input_tokens": request.estimated_input_tokens,
                },
            )
            try:
                response = await gateway.attempt(run.transport, request, run.remaining_time())
            except ProviderError as error:
                if snapshot is not None:
                    run.state.transport = snapshot()
                retries += 1
                await self._after_error(error, retries)
                continue
            if snapshot is not None:
                run.state.transport = snapshot()
            run.state.usage = run.state.usage + response.usage
            self._record(response)
            failpoint("after_model_response")
            if not response.is_empty:
                return response, mode
            empty += 1
            if empty >= 2:
                raise EmptyModelTurn(
                    "the model returned an empty turn (no text, no tool calls) twice in a row",
                    step=run.state.step,
                    details={"attempts": empty},
                )

    async def _after_error(self, error: ProviderError, retries: int) -> None:
        run = self.run
        retry = error.retryable and retries <= self.policy.retries
        delay = self.policy.delay(retries, error.retry_after) if retry else None
        run.emit(
            "model_error",
            {
                "step": run.state.step,
                "status": error.status,
                "retryable": error.retryable,
                "message": error.message,
                "retry_in": delay,
            },
        )
        remaining = run.remaining_time()
        if remaining is not None and (remaining <= 0 or (delay or 0) >= remaining):
            raise DeadlineExceeded(
                f"the run reached its deadline of {run.limits.deadline:g}s while the model was "
                f"failing ({error.message})",
                step=run.state.step,
                details={"deadline": run.limits.deadline},
            )
        if delay is None:
            what = "failed" if not error.retryable else f"kept failing after {retries} attempts"
            raise ModelError(
                f"the model call {what}: {error.message}",
                step=run.state.step,
                details={"status": error.status, "retryable": error.retryable},
            )
        await asyncio.sleep(delay)

    def _record(self, response: ModelResponse) -> None:
        run = self.run
        run.emit(
            "model_response",
            {
                "step": run.state.step,
                "text": response.text,
                "tool_calls": [
                    {"id": c.id, "name": c.name, "arguments": c.raw_arguments}
                    for c in response.tool_calls
                ],
                "usage": {
                    "input_tokens": response.usage.input_tokens,
                    "output_tokens": response.usage.output_tokens,
                    "cached_input_tokens": response.usage.cached_input_tokens,
                },
                "stop_reason": response.stop_reason,
                "empty": response.is_empty,
            },
        )
