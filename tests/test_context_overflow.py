"""Recognising a provider's refusal of a request over the model's window (keel/transports/
overflow.py), and the `ContextOverflow` kind it becomes (issue 44). The transports' real error
shapes are in tests/contract/test_context_overflow.py."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from keel.errors import ContextOverflow, ProviderError
from keel.messages import ModelRequest, UserMessage
from keel.transports.local.llama import map_error as local_map_error
from keel.transports.overflow import OTHER_MEANINGS, Overflow, as_overflow, find_overflow
from keel.transports.policy import attempt, scrubbed
from keel.transports.scripted import ScriptedTransport

SECRET = "sk-test-secret-key-0123456789"

WORDINGS = [
    # (who, status, message, body, requested, limit)
    (
        "openai chat",
        400,
        "This model's maximum context length is 8192 tokens. However, you "
        "requested 9123 tokens (8123 in the messages, 1000 in the completion).",
        None,
        9123,
        8192,
    ),
    (
        "openai chat, messages",
        400,
        "This model's maximum context length is 4097 tokens. However,"
        " your messages resulted in 4294 tokens. Please reduce the length of the messages.",
        None,
        4294,
        4097,
    ),
    (
        "openai responses",
        400,
        "Your input exceeds the context window of this model. Please "
        "adjust your input and try again.",
        None,
        None,
        None,
    ),
    ("openai code only", 400, "Invalid request.", {"code": "context_length_exceeded"}, None, None),
    (
        "vllm, newer",
        400,
        "'max_tokens' or 'max_completion_tokens' is too large: 1000. This "
        "model's maximum context length is 4096 tokens and your request has 3500 input tokens "
        "(1000 > 4096 - 3500).",
        None,
        3500,
        4096,
    ),
    (
        "openrouter",
        400,
        "This endpoint's maximum context length is 32768 tokens. However, you "
        "requested about 42832 tokens (42832 of text input).",
        None,
        42832,
        32768,
    ),
    ("anthropic", 400, "prompt is too long: 200251 tokens > 200000 maximum", None, 200251, 200000),
    (
        "anthropic, max_tokens",
        400,
        "input length and `max_tokens` exceed context limit: 199759 "
        "+ 8192 > 200000, decrease input length or `max_tokens` and try again",
        None,
        207951,
        200000,
    ),
    (
        "llama-cpp-python",
        None,
        "Requested tokens (2285) exceed context window of 2048",
        None,
        2285,
        2048,
    ),
    (
        "llama-server",
        400,
        "the request exceeds the available context size, try increasing it",
        {"error": {"type": "exceed_context_size_error", "n_prompt_tokens": 14429, "n_ctx": 8192}},
        14429,
        8192,
    ),
    (
        "litellm",
        400,
        "litellm.ContextWindowExceededError: litellm.BadRequestError: "
        "OpenAIException - something about the window",
        None,
        None,
        None,
    ),
    (
        "azure",
        400,
        "Input tokens exceed the configured limit of 272000 tokens. Your messages "
        "resulted in 509178 tokens. Please reduce the length of the messages.",
        None,
        509178,
        272000,
    ),
    (
        "sglang",
        400,
        "The input (9000 tokens) is longer than the model's context length (8192 tokens).",
        None,
        9000,
        8192,
    ),
    (
        "gemini",
        400,
        "The input token count (2800010) exceeds the maximum number of tokens allowed (1048575).",
        None,
        2800010,
        1048575,
    ),
    (
        "a stream's error event",
        None,
        "OpenAI API: the stream reported an error: {'type': "
        "'invalid_request_error', 'code': 'context_length_exceeded'}",
        None,
        None,
        None,
    ),
    (
        "grouped digits",
        400,
        "This model's maximum context length is 131,072 tokens. However, "
        "you requested 131,134 tokens.",
        None,
        131134,
        131072,
    ),
]


@pytest.mark.parametrize(
    ("status", "message", "body", "requested", "limit"),
    [w[1:] for w in WORDINGS],
    ids=[w[0] for w in WORDINGS],
)
def test_each_providers_wording_is_recognised_with_its_numbers(
    status: int | None, message: str, body: object, requested: int | None, limit: int | None
) -> None:
    assert find_overflow(status, message, body) == Overflow(requested, limit)


@pytest.mark.parametrize(
    ("status", "message"),
    [
        (400, "Invalid 'input[3].content': string too long."),
        (400, "max_tokens: 10000 > 4096, which is the maximum allowed number of output tokens"),
        (401, "Incorrect API key provided"),
        (500, "The server had an error while processing your request."),
        (None, "local model failed: RuntimeError: llama_decode returned -3"),
    ],
)
def test_other_failures_are_not_overflows(status: int | None, message: str) -> None:
    assert find_overflow(status, message) is None


@pytest.mark.parametrize("status", sorted(OTHER_MEANINGS))
def test_a_status_with_a_meaning_of_its_own_wins_over_the_words(status: int) -> None:
    message = "This model's maximum context length is 8192 tokens"
    assert find_overflow(status, message, {"code": "context_length_exceeded"}) is None


@given(
    st.one_of(st.none(), st.integers()),
    st.text(),
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
        max_leaves=8,
    ),
)
def test_any_status_message_and_body_are_read_without_raising(
    status: int | None, message: str, body: object
) -> None:
    found = find_overflow(status, message, body)
    if found is not None:
        for number in (found.requested, found.limit):
            assert number is None or 0 <= number <= 10**12


@given(
    st.text(max_size=200),
    st.text(max_size=200),
    st.integers(min_value=0, max_value=10**12),
    st.integers(min_value=0, max_value=10**12),
)
def test_a_wording_anywhere_in_any_text_is_found_with_its_numbers(
    before: str, after: str, requested: int, limit: int
) -> None:
    message = f"{before} prompt is too long: {requested} tokens > {limit} maximum {after}"
    assert find_overflow(400, message) == Overflow(requested, limit)


@given(st.text(alphabet=st.characters(codec="ascii", exclude_characters="_"), max_size=300))
def test_text_without_a_word_of_the_window_is_not_an_overflow(message: str) -> None:
    words = ("context", "too long", "exceed", "windowexceeded", "token")
    if not any(word in message.lower() for word in words):
        assert find_overflow(400, message) is None


def test_a_number_past_any_token_count_is_not_kept() -> None:
    found = find_overflow(400, f"prompt is too long: {10**15} tokens > 200000 maximum")
    assert found == Overflow(None, 200000)


def test_the_kind_survives_scrubbing_and_copies() -> None:
    error = ContextOverflow(f"refused for {SECRET}", status=400, requested=9, limit=8)
    clean = scrubbed(error, SECRET)
    assert isinstance(clean, ContextOverflow)
    assert (clean.status, clean.requested, clean.limit, clean.retryable) == (400, 9, 8, False)
    assert SECRET not in clean.message and SECRET not in str(clean)
    assert clean.__traceback__ is None and clean.__cause__ is None
    short = clean.with_message("cut")
    assert (type(short), short.message, str(short), short.limit) == (
        ContextOverflow,
        "cut",
        "cut",
        8,
    )


def test_an_overflow_is_a_provider_error_never_retried() -> None:
    error = as_overflow(
        ProviderError("prompt is too long: 9 tokens > 8 maximum", status=500, retryable=True)
    )
    assert isinstance(error, ContextOverflow) and isinstance(error, ProviderError)
    assert not error.retryable
    plain = ProviderError("bad request", status=400)
    assert as_overflow(plain) is plain


def test_an_error_raised_inside_an_attempt_becomes_an_overflow() -> None:
    """Errors in a 200 body or in a stream are ProviderErrors raised under the SDK: the policy's
    one attempt recognises them too, and scrubs the key from them."""

    async def refused() -> None:
        raise ProviderError(f"the stream reported an error: context_length_exceeded {SECRET}")

    with pytest.raises(ContextOverflow) as info:
        asyncio.run(
            attempt(refused, foreign=OSError, to_error=lambda e: ProviderError(""), secret=SECRET)
        )
    assert SECRET not in info.value.message


def test_the_embedded_models_overflow_names_both_numbers() -> None:
    error = local_map_error(
        ValueError("Requested tokens (600) exceed context window of 512"), n_ctx=512
    )
    assert isinstance(error, ContextOverflow)
    assert (error.requested, error.limit) == (600, 512)
    assert "the prompt is 600 tokens, more than its context window of 512" in error.message


def test_a_scripted_overflow_is_raised_as_the_provider_would(tmp_path: Path) -> None:
    script = tmp_path / "overflow.json"
    refusal = {"status": 400, "message": "prompt is too long: 9000 tokens > 8192 maximum"}
    script.write_text(json.dumps({"turns": [{"error": refusal}]}))
    model = ScriptedTransport.from_file(str(script))
    request = ModelRequest("system", (), (UserMessage("question"),))
    with pytest.raises(ContextOverflow) as info:
        asyncio.run(model.request(request))
    assert (info.value.requested, info.value.limit, info.value.status) == (9000, 8192, 400)
