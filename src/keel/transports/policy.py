"""Provider policy: the rules every transport applies to a failed attempt, written once.

Three questions have one answer here, whatever wire protocol met the failure:

* **Is it worth another attempt?** `is_retryable` classifies an HTTP status (and a provider's
  error code) for the gateway, which owns retries, backoff and budgets. `RETRYABLE_STATUSES`
  says why each status is in the set.
* **How long does the provider ask us to wait?** `parse_retry_after` reads ``retry-after-ms``
  and ``retry-after`` (seconds or an HTTP date).
* **What may a message say?** `scrub` takes the API key out of any text built from what a
  server sent back (some servers and proxies echo the key they rejected), and `shorten` keeps
  it to a length a person can read and the store need not hold whole (the gateway applies
  `keel.limits.Limits.max_error_chars` to every attempt's error, after the scrub).

And a fourth, **was the request too long for the model's window?**, has its own module
(`keel.transports.overflow`); `attempt` applies it to every error, so an overflow leaves any
transport as a `keel.errors.ContextOverflow`.

One rule about exception chaining, which `attempt` applies: **a ProviderError carries no
foreign exception**. An SDK exception holds the request it failed on, and the request's headers
hold the key (``Authorization: Bearer ...``, ``x-api-key``), so chaining it (``raise ... from
exc``) would put the key within reach of every traceback printer, log handler and debugger.
``from None`` is not enough on its own: it hides ``__context__`` from printed tracebacks but
keeps the exception in it. So the ProviderError is built inside the ``except`` block, raised
after it (no ``__context__``) with ``from None`` (no ``__cause__``), and everything worth knowing
about the failure is in its scrubbed message.

All of it is pure apart from `attempt`, which awaits the call it is given.
"""

from __future__ import annotations

import datetime
import email.utils
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar

from keel.errors import ProviderError
from keel.transports.overflow import as_overflow

__all__ = [
    "MIN_SECRET_LENGTH",
    "NOT_RETRYABLE_CODES",
    "REDACTED",
    "RETRYABLE_STATUSES",
    "attempt",
    "is_retryable",
    "parse_retry_after",
    "scrub",
    "scrubbed",
    "shorten",
]

RETRYABLE_STATUSES: Mapping[int, str] = {
    408: "Request Timeout: the server gave up waiting for this request; a new one may pass.",
    409: "Conflict: OpenAI and Anthropic use it for transient locking on their side.",
    429: "Too Many Requests: a rate limit, which passes with time (see NOT_RETRYABLE_CODES).",
    500: "Internal Server Error: the provider failed, not the request.",
    502: "Bad Gateway: a proxy or load balancer lost the upstream; usually brief.",
    503: "Service Unavailable: the provider is down or shedding load for a while.",
    504: "Gateway Timeout: the upstream did not answer in time.",
    529: "Overloaded (Anthropic): the API is over capacity; it asks callers to back off.",
}
"""The statuses a later attempt may get past, and why. Every other 5xx is retried as well (the
server's fault by definition; the list names the ones providers actually send). Every other 4xx
fails at once: a bad request, a missing or wrong key, no permission, an unknown model or a
prompt that is too long (400, 401, 403, 404, 413, 422) is the same on the next attempt."""

NOT_RETRYABLE_CODES = frozenset({"insufficient_quota"})
"""Error codes that no wait will fix even under a retryable status: OpenAI sends an exhausted
billing quota as a 429 with this code, and it fails at once instead of backing off."""

MIN_SECRET_LENGTH = 8
"""Shorter "keys" are not scrubbed. Real provider keys are dozens of characters; a short value is
a placeholder ("x", "none", "test") that a local server accepts, and replacing it everywhere
would cut ordinary words out of messages ("invalid [redacted]-api-key")."""

REDACTED = "[redacted]"

_DELAY_SECONDS = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*")
"""RFC 9110 delay-seconds (digits), also with a decimal part, which some servers send."""

_Failure = TypeVar("_Failure", bound=Exception)
_Result = TypeVar("_Result")


def is_retryable(status: int, code: str | None = None) -> bool:
    """Whether an attempt that failed with HTTP `status` (and the provider's error `code`, when
    the body has one) may succeed later; see `RETRYABLE_STATUSES` and `NOT_RETRYABLE_CODES`."""
    if code in NOT_RETRYABLE_CODES:
        return False
    return status in RETRYABLE_STATUSES or 500 <= status <= 599


def parse_retry_after(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """Seconds the provider asks us to wait, or None when it does not say (or says nonsense).

    ``retry-after-ms`` (OpenAI's and Anthropic's, in milliseconds) wins over ``retry-after``,
    which is either delay-seconds or an HTTP date (a date in the past means no wait). Values
    that are negative, not finite or unreadable count as absent, so a bad header falls back to
    the next one or to the gateway's own backoff. `now` is the current time (for HTTP dates).
    Never raises; the result is never negative. `headers` is any mapping with lower-case names
    or a case-insensitive one (httpx's).
    """
    millis = _delay(headers.get("retry-after-ms"))
    if millis is not None:
        return millis / 1000
    value = headers.get("retry-after")
    if value is None:
        return None
    seconds = _delay(value)
    if seconds is not None:
        return seconds
    return _until(value, time.time() if now is None else now)


def _delay(value: str | None) -> float | None:
    if value is None:
        return None
    match = _DELAY_SECONDS.fullmatch(value)
    if match is None:
        return None
    number = float(match.group(1))
    return number if number != float("inf") else None


def _until(date: str, now: float) -> float | None:
    """Seconds from `now` until an HTTP date (GMT when it names no zone), at least 0."""
    try:
        when = email.utils.parsedate_to_datetime(date)
        if when.tzinfo is None:  # "-0000" or no zone: an HTTP date is GMT by definition
            when = when.replace(tzinfo=datetime.UTC)
        return max(0.0, when.timestamp() - now)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


def scrub(text: str, secret: str | None) -> str:
    """`text` with every occurrence of `secret` replaced by `REDACTED`; unchanged when there is
    no secret or it is shorter than `MIN_SECRET_LENGTH`."""
    if secret and len(secret) >= MIN_SECRET_LENGTH:
        return text.replace(secret, REDACTED)
    return text


def shorten(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, saying how much was left out; unchanged when short."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... [{len(text) - limit} more characters not kept]"


def scrubbed(error: ProviderError, secret: str | None) -> ProviderError:
    """A fresh copy of `error` (its class and fields kept: a `ContextOverflow` stays one) with
    `secret` scrubbed from its message: never raised, so it has no traceback and nothing
    chained to it yet."""
    return error.with_message(scrub(error.message, secret))


async def attempt(
    call: Callable[[], Awaitable[_Result]],
    *,
    foreign: type[_Failure],
    to_error: Callable[[_Failure], ProviderError],
    secret: str | None,
) -> _Result:
    """One provider attempt under the policy: `call()`'s result, or a ProviderError.

    A `foreign` exception (the SDK's, llama.cpp's) becomes ``to_error(exc)``, unless it wraps a
    ProviderError Keel's own HTTP layer raised under the SDK (an answer past its size limit:
    ``anthropic`` reports any such failure as a connection error caused by it), which passes on
    as it is, like one raised while reading the answer. Either way a refusal of a request too
    long for the model's window becomes a `ContextOverflow` (`as_overflow`), the message is
    scrubbed of `secret` and the error is raised with nothing chained to it (see the module
    docstring).
    """
    try:
        return await call()
    except ProviderError as exc:
        error = exc
    except foreign as exc:
        error = _carried(exc) or to_error(exc)
    raise scrubbed(as_overflow(error), secret) from None


def _carried(exc: BaseException) -> ProviderError | None:
    """The ProviderError that caused `exc`, if one did."""
    cause = exc.__cause__
    while cause is not None:
        if isinstance(cause, ProviderError):
            return cause
        cause = cause.__cause__
    return None
