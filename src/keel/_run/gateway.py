"""The model gateway: one attempt through a transport, with a timeout, and the retry schedule.

Transports raise ProviderError; anything else a transport lets escape (a bug, an SDK surprise)
is mapped here, once, so the run loop only ever sees ProviderError or a response.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass

from keel.errors import ProviderError
from keel.messages import ModelRequest, ModelResponse
from keel.transports.base import Transport

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
    transport: Transport, request: ModelRequest, timeout: float | None
) -> ModelResponse:
    """One model call. Raises ProviderError for every way it can fail."""
    try:
        async with asyncio.timeout(timeout):
            return await transport.request(request)
    except ProviderError:
        raise
    except TimeoutError:
        raise ProviderError(
            f"the model did not answer within {timeout:.1f}s", retryable=True
        ) from None
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        raise ProviderError(
            f"transport {transport.name} failed unexpectedly: {type(exc).__name__}: {exc}",
            retryable=False,
        ) from exc
