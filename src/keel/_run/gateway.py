"""The model gateway: one attempt through a transport, with a timeout, and the retry schedule.

Transports raise ProviderError; anything else a transport lets escape (a bug, an SDK surprise)
is mapped here, once, so the run loop only ever sees ProviderError or a response. Three rules
hold for every transport, the ones Keel ships and any a user writes:

- an attempt takes at most `Limits.model_timeout` seconds in all (less when the run's deadline
  is nearer), a retryable timeout past it; for a transport that reports its tokens
  (`keel.transports.liveness`) the timeout measures silence instead, no token for that long
  (the deadline still bounds the whole call), and the answer it had written when a timeout
  does come is kept as a cut-off response (stop reason ``timeout``), not thrown away;
- an error message is kept to `Limits.max_error_chars` characters;
- a response keeps the transport contract: text and a stop reason that are strings (or None),
  calls with string ids and names, usage in token counts (integers from 0 to
  `keel.transports.base.MAX_REPORTED_TOKENS`), provider details that are finite JSON. A
  response that breaks it is a non-retryable ProviderError, so nothing non-finite or of the
  wrong type reaches the budgets, the store or the JSON Keel prints.
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass

from keel.errors import ProviderError
from keel.limits import Limits
from keel.messages import ModelRequest, ModelResponse, Usage
from keel.transports import liveness
from keel.transports.base import MAX_REPORTED_TOKENS, Transport
from keel.transports.policy import shorten

__all__ = [
    "RetryPolicy",
    "attempt",
]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Exponential backoff with full jitter; a provider's Retry-After wins when it asks longer."""

    retries: int = 4
    base_delay: float = 0.5
    max_delay: float = 30.0

    def delay(
        self, retry: int, retry_after: float | None = None, rng: random.Random | None = None
    ) -> float:
        """Seconds to wait before retry number `retry` (1-based)."""
        ceiling = min(self.max_delay, self.base_delay * 2 ** (retry - 1))
        jittered = (rng or random).uniform(ceiling / 2, ceiling)
        if retry_after is not None:
            return max(jittered, min(retry_after, self.max_delay))
        return jittered


async def attempt(
    transport: Transport, request: ModelRequest, limits: Limits, remaining: float | None
) -> ModelResponse:
    """One model call, `remaining` seconds before the run's deadline (None: no deadline).
    Raises ProviderError for every way it can fail."""
    timeout = limits.model_timeout if remaining is None else min(limits.model_timeout, remaining)
    live: _Watch | None = None
    try:
        async with asyncio.timeout(timeout) as scope:
            live = _Watch(scope, limits.model_timeout, remaining)
            token = liveness.opened(live)
            try:
                response = await transport.request(request)
            finally:
                liveness.closed(token)
                live.close()
    except ProviderError as error:
        if len(error.message) <= limits.max_error_chars:
            raise
        raise _shortened(error, limits.max_error_chars) from None
    except TimeoutError:
        kept = None if live is None else live.kept()
        if live is not None and kept is not None:
            usage = Usage(live.prompt_tokens, live.tokens)
            return ModelResponse(text=kept, usage=usage, stop_reason="timeout")
        deadline = live.at_deadline() if live is not None else timeout < limits.model_timeout
        which = "the run's deadline" if deadline else "model_timeout"
        if live is not None and live.last is not None and not deadline:
            raise ProviderError(
                f"the model wrote no token for {limits.model_timeout:.1f}s (model_timeout)",
                retryable=True,
            ) from None
        raise ProviderError(
            f"the model did not answer within {timeout:.1f}s ({which})", retryable=True
        ) from None
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        message = f"transport {transport.name} failed unexpectedly: {type(exc).__name__}: {exc}"
        raise ProviderError(shorten(message, limits.max_error_chars), retryable=False) from exc
    broken = _broken_contract(response)
    if broken is not None:
        message = f"transport {transport.name} returned a response that {broken}"
        raise ProviderError(shorten(message, limits.max_error_chars), retryable=False)
    return response


class _Watch(liveness.Liveness):
    """A `Liveness` whose every token moves the attempt's timeout to `silence` seconds later
    (never past the run's deadline). Tokens come from a worker thread: the move is made on the
    event loop, and not at all once the attempt is over."""

    def __init__(self, scope: asyncio.Timeout, silence: float, remaining: float | None) -> None:
        self._loop = asyncio.get_running_loop()
        self._scope = scope
        self._silence = silence
        self._end = None if remaining is None else self._loop.time() + remaining
        self._open = True
        super().__init__(on_token=self._soon)

    def _soon(self) -> None:
        if self._open:
            self._loop.call_soon_threadsafe(self._move)

    def _move(self) -> None:
        if not self._open or self._scope.expired():
            return
        when = self._loop.time() + self._silence
        self._scope.reschedule(when if self._end is None else min(when, self._end))

    def close(self) -> None:
        self._open = False

    def at_deadline(self) -> bool:
        """The timeout that came was the run's deadline, not a silence."""
        return self._end is not None and self._loop.time() >= self._end - 0.01


def _shortened(error: ProviderError, limit: int) -> ProviderError:
    """A copy of `error` with its message shortened to `limit` characters."""
    return error.with_message(shorten(error.message, limit))  # its kind kept (ContextOverflow)


def _broken_contract(response: ModelResponse) -> str | None:
    """What in `response` breaks the transport contract (see the module docstring), or None."""
    try:
        return _contract_breach(response)
    except Exception as exc:  # not even shaped like a ModelResponse
        return f"is not a ModelResponse ({type(exc).__name__}: {exc})"


def _contract_breach(response: ModelResponse) -> str | None:
    usage = response.usage
    for name in ("input_tokens", "output_tokens", "cached_input_tokens"):
        count = getattr(usage, name, None)
        if type(count) is not int or not 0 <= count <= MAX_REPORTED_TOKENS:
            return f"reports usage.{name} as {count!r:.40}, not a token count"
    for name in ("text", "stop_reason", "response_id", "model"):
        value = getattr(response, name)
        if value is not None and not isinstance(value, str):
            return f"has a {name} of type {type(value).__name__}, not a string"
    for call in response.tool_calls:
        if not (isinstance(call.id, str) and isinstance(call.name, str)):
            return "has a tool call whose id or name is not a string"
    try:
        json.dumps(response.provider_details, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        return f"has provider details that are not finite JSON ({exc})"
    return None
