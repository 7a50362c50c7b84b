"""One provider policy for every transport (`keel.transports.policy`).

The same HTTP status is retried, or not, whichever transport met it; a Retry-After header is read
one way; the key is scrubbed one way, and a short placeholder key scrubs nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from email.utils import format_datetime
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from keel.errors import ProviderError
from keel.messages import ModelRequest, UserMessage
from keel.transports.anthropic import AnthropicTransport
from keel.transports.base import Transport
from keel.transports.local import LocalTransport
from keel.transports.openai_chat import OpenAIChatTransport
from keel.transports.openai_responses import OpenAIResponsesTransport
from keel.transports.policy import (
    MIN_SECRET_LENGTH,
    REDACTED,
    RETRYABLE_STATUSES,
    attempt,
    is_retryable,
    parse_retry_after,
    scrub,
)
from keel.transports.scripted import ScriptedTransport

KEY = "sk-proj-Vq3xT9Lm2Rk8Wz4Np6Bd1Hs5Jf7Gc0Ya2Ue4Io6Pl8Kn"
REQUEST = ModelRequest("sys", (), (UserMessage("q"),))

EXPECTED = {
    400: False,
    401: False,
    403: False,
    404: False,
    408: True,
    409: True,
    413: False,
    422: False,
    429: True,
    500: True,
    502: True,
    503: True,
    504: True,
    529: True,
}
"""The whole classification, as every transport must apply it."""


def _error_body(vendor: str, status: int) -> dict[str, Any]:
    message = f"simulated failure {status}"
    if vendor == "anthropic":
        return {"type": "error", "error": {"type": "api_error", "message": message}}
    return {"error": {"message": message, "type": "x", "param": None, "code": None}}


def _over_http(vendor: str, make: Callable[[httpx.AsyncClient], Transport]) -> Any:
    def build(status: int) -> Transport:
        body = _error_body(vendor, status)
        answer = httpx.MockTransport(lambda request: httpx.Response(status, json=body))
        return make(httpx.AsyncClient(transport=answer))

    return build


def _scripted(status: int) -> Transport:
    return ScriptedTransport.from_dict({"turns": [{"error": {"status": status}}]})


FAILING_TRANSPORTS: Mapping[str, Callable[[int], Transport]] = {
    "openai_responses": _over_http(
        "openai", lambda http: OpenAIResponsesTransport("m", http_client=http, api_key=KEY)
    ),
    "openai_chat": _over_http(
        "openai", lambda http: OpenAIChatTransport("m", http_client=http, api_key=KEY)
    ),
    "anthropic": _over_http(
        "anthropic", lambda http: AnthropicTransport("m", http_client=http, api_key=KEY)
    ),
    "scripted": _scripted,
}


@pytest.mark.parametrize("status", list(EXPECTED))
@pytest.mark.parametrize("transport", list(FAILING_TRANSPORTS))
async def test_every_transport_retries_the_same_statuses(transport: str, status: int) -> None:
    with pytest.raises(ProviderError) as info:
        await FAILING_TRANSPORTS[transport](status).request(REQUEST)
    assert (info.value.status, info.value.retryable) == (status, EXPECTED[status])


async def test_a_short_placeholder_key_does_not_scrub_ordinary_text() -> None:
    body = {
        "type": "error",
        "error": {"type": "authentication_error", "message": "invalid x-api-key"},
    }
    answer = httpx.MockTransport(lambda request: httpx.Response(401, json=body))
    http = httpx.AsyncClient(transport=answer)
    with pytest.raises(ProviderError) as info:
        await AnthropicTransport("m", http_client=http, api_key="x").request(REQUEST)
    assert "invalid x-api-key" in info.value.message


# --- the classification, pure ----------------------------------------------------------------


@pytest.mark.parametrize("status", list(EXPECTED))
def test_status_classification_is_the_table(status: int) -> None:
    assert is_retryable(status) is EXPECTED[status]


def test_every_5xx_is_retryable_and_no_other_4xx_is() -> None:
    assert all(is_retryable(status) for status in range(500, 600))
    assert [s for s in range(400, 500) if is_retryable(s)] == [408, 409, 429]
    assert all(reason for reason in RETRYABLE_STATUSES.values())  # each one says why


def test_an_exhausted_quota_is_a_429_that_is_not_retried() -> None:
    assert not is_retryable(429, "insufficient_quota")
    assert is_retryable(429, "rate_limit_exceeded")


# --- Retry-After -----------------------------------------------------------------------------

NOW = 1_792_567_680.0  # Wed, 21 Oct 2026 07:28:00 GMT


def test_retry_after_reads_milliseconds_seconds_and_http_dates() -> None:
    assert parse_retry_after({"retry-after": "Wed, 21 Oct 2026 07:28:30 GMT"}, NOW) == 30
    assert parse_retry_after({"retry-after": "Wed, 21 Oct 2026 07:28:30 -0000"}, NOW) == 30
    assert parse_retry_after({"retry-after": "Wed, 21 Oct 2026 07:27:00 GMT"}, NOW) == 0
    assert parse_retry_after({"retry-after-ms": "1500", "retry-after": "9"}, NOW) == 1.5
    assert parse_retry_after({"retry-after": " 2.5 "}, NOW) == 2.5
    assert parse_retry_after(httpx.Headers({"Retry-After": "4"}), NOW) == 4


@pytest.mark.parametrize(
    "value", ["soon", "", "-5", "+5", "1e3", "nan", "inf", "1_000", "0x10", "\u0663"]
)
def test_retry_after_nonsense_counts_as_absent(value: str) -> None:
    assert parse_retry_after({"retry-after": value}, NOW) is None
    assert parse_retry_after({"retry-after-ms": value, "retry-after": "7"}, NOW) == 7


def test_a_number_too_large_for_a_float_counts_as_absent() -> None:
    assert parse_retry_after({"retry-after": "9" * 400}, NOW) is None


@given(st.dictionaries(st.sampled_from(["retry-after", "retry-after-ms", "x"]), st.text()))
def test_retry_after_never_raises_and_is_never_negative(headers: dict[str, str]) -> None:
    seconds = parse_retry_after(headers, NOW)
    assert seconds is None or (0 <= seconds < float("inf"))


@given(st.integers(min_value=0, max_value=10**12))
def test_retry_after_seconds_are_read_exactly(seconds: int) -> None:
    assert parse_retry_after({"retry-after": str(seconds)}, NOW) == seconds


@given(st.integers(min_value=0, max_value=10**9), st.text())
def test_retry_after_ms_wins_over_retry_after(millis: int, other: str) -> None:
    headers = {"retry-after-ms": str(millis), "retry-after": other}
    assert parse_retry_after(headers, NOW) == millis / 1000


@given(st.datetimes(min_value=datetime(1990, 1, 1), max_value=datetime(2200, 1, 1)))
def test_retry_after_http_dates_are_seconds_from_now_or_zero(when: datetime) -> None:
    stamp = when.replace(microsecond=0, tzinfo=UTC)
    header = format_datetime(stamp, usegmt=True)
    expected = max(0.0, stamp.timestamp() - NOW)
    assert parse_retry_after({"retry-after": header}, NOW) == pytest.approx(expected)


# --- scrubbing -------------------------------------------------------------------------------


def test_the_key_is_scrubbed_wherever_it_appears() -> None:
    text = f"Incorrect API key provided: {KEY}. Bearer {KEY}"
    assert scrub(text, KEY) == f"Incorrect API key provided: {REDACTED}. Bearer {REDACTED}"


@pytest.mark.parametrize("secret", [None, "", "x", "none", "test", "sk-1234"])
def test_a_missing_or_short_key_scrubs_nothing(secret: str | None) -> None:
    text = "invalid x-api-key: none given in this test (sk-1234)"
    assert len(secret or "") < MIN_SECRET_LENGTH
    assert scrub(text, secret) == text


KEY_ALPHABET = st.characters(categories=["Lu", "Ll", "Nd"]) | st.sampled_from("-_")


@given(st.text(), st.text(KEY_ALPHABET, min_size=MIN_SECRET_LENGTH))
def test_no_scrubbed_text_contains_the_key(text: str, secret: str) -> None:
    assert secret not in scrub(text + secret + text, secret) or secret in REDACTED


# --- one attempt -------------------------------------------------------------------------------


class SdkFailure(Exception):
    def __init__(self, headers: dict[str, str]) -> None:
        super().__init__("sdk failed")
        self.headers = headers


async def test_an_attempt_maps_the_foreign_error_and_chains_nothing() -> None:
    async def call() -> str:
        raise SdkFailure({"authorization": f"Bearer {KEY}"})

    with pytest.raises(ProviderError) as info:
        await attempt(
            call,
            foreign=SdkFailure,
            to_error=lambda exc: ProviderError(f"mapped: {exc.headers}", status=503),
            secret=KEY,
        )
    error = info.value
    assert error.message == "mapped: {'authorization': 'Bearer [redacted]'}"
    assert error.status == 503
    assert error.__cause__ is None and error.__context__ is None


async def test_an_attempt_scrubs_a_provider_error_raised_while_reading_the_answer() -> None:
    async def call() -> str:
        try:
            raise ValueError(KEY)
        except ValueError:
            raise ProviderError(f"not JSON: {KEY}", retryable=True) from None

    with pytest.raises(ProviderError) as info:
        await attempt(call, foreign=SdkFailure, to_error=lambda exc: ProviderError(""), secret=KEY)
    assert info.value.message == "not JSON: [redacted]" and info.value.retryable
    assert info.value.__context__ is None


async def test_an_attempt_returns_the_answer() -> None:
    async def call() -> str:
        return "answer"

    def never(exc: SdkFailure) -> ProviderError:
        raise AssertionError("nothing failed")

    assert await attempt(call, foreign=SdkFailure, to_error=never, secret=KEY) == "answer"


class FailingLlama:
    """Just enough of ``llama_cpp.Llama`` for a generation that fails."""

    def __init__(self) -> None:
        self.input_ids: list[int] = []
        self.n_tokens = 0

    def token_eos(self) -> int:
        return 0

    def tokenize(self, *args: Any, **kwargs: Any) -> Any:
        raise ValueError("Requested tokens (5014) exceed context window of 4096")


async def test_the_local_transport_follows_the_same_rule() -> None:
    transport = LocalTransport(n_ctx=4096, max_tokens=16)
    transport._llama = FailingLlama()  # loaded, as far as the transport knows
    with pytest.raises(ProviderError) as info:
        await transport.request(REQUEST)
    assert "5014 tokens" in info.value.message and not info.value.retryable
    assert info.value.__cause__ is None and info.value.__context__ is None
