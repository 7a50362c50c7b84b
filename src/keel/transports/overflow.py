"""A request longer than the model's context window, recognised in one place for every wire.

Providers refuse such a request in their own words, and under statuses that mean other things
too (a 400 is any bad request; llama.cpp's server once sent a 500). `find_overflow` reads a
failed attempt's status, message and error body and says whether it was that refusal, with the
provider's numbers when it gives them; `as_overflow` turns such a `ProviderError` into a
`keel.errors.ContextOverflow`. `keel.transports.policy.attempt` applies it to every error a
transport's attempt ends with (the SDKs' statuses, errors in a 200 body, errors in a stream, the
embedded model's), and each transport's `map_error` applies it where it still holds the body.

The wordings are data (`WORDINGS`, each with who sends it); ADR 0056 lists them. A status
that means something else (a wrong key, an unknown model, a rate limit, a timeout) is never an
overflow, whatever the message says. Pure: no I/O, never raises.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from keel.errors import ContextOverflow, ProviderError

__all__ = [
    "CODES",
    "OTHER_MEANINGS",
    "WORDINGS",
    "Overflow",
    "Wording",
    "as_overflow",
    "find_overflow",
]

_N = r"([0-9](?:[0-9,]*[0-9])?)"
"""A token count as providers write it: digits, sometimes grouped with commas."""


@dataclass(frozen=True, slots=True)
class Wording:
    """How one provider (or server) says that a request is over the window."""

    sender: str
    """Who says it this way, for people reading the table."""
    pattern: re.Pattern[str]
    """Matched case-insensitively anywhere in the message. Named groups, where the wording has
    them: ``limit`` (the window), ``requested`` (what the request came to), or ``input`` and
    ``output`` (the prompt and the output reservation, whose sum is what was requested)."""


def _wording(sender: str, pattern: str) -> Wording:
    return Wording(sender, re.compile(pattern.replace("{n}", _N), re.IGNORECASE))


WORDINGS: tuple[Wording, ...] = (
    _wording(
        "OpenAI Chat Completions; vLLM, DeepSeek, Mistral, OpenRouter and most compatible servers",
        r"maximum context length is (?P<limit>{n}) tokens",
    ),
    _wording("OpenAI Responses API", r"input exceeds the context window of this model"),
    _wording(
        "Anthropic Messages", r"prompt is too long: (?P<requested>{n}) tokens > (?P<limit>{n})"
    ),
    _wording(
        "Anthropic Messages (input plus max_tokens)",
        r"input length and `?max_tokens`? exceed context limit: (?P<input>{n}) \+ (?P<output>{n})"
        r" > (?P<limit>{n})",
    ),
    _wording(
        "llama-cpp-python (the embedded model, and its server)",
        r"requested tokens \((?P<requested>{n})\) exceed context window of (?P<limit>{n})",
    ),
    _wording("llama.cpp server (llama-server)", r"exceeds the available context size"),
    _wording("LiteLLM (its exception's name in the message)", r"ContextWindowExceededError"),
    _wording(
        "Azure OpenAI and OpenAI's input limit",
        r"input tokens exceed the configured limit of (?P<limit>{n}) tokens",
    ),
    _wording(
        "SGLang",
        r"input \((?P<requested>{n}) tokens\) is longer than the model's context length"
        r" \((?P<limit>{n}) tokens\)",
    ),
    _wording(
        "Gemini's OpenAI-compatible endpoint",
        r"input token count (?:\((?P<requested>{n})\) )?exceeds the maximum number of tokens"
        r" allowed \((?P<limit>{n})\)",
    ),
    _wording(
        "an error code written into the message (stream error events, LiteLLM, proxies)",
        r"context_length_exceeded|exceed_context_size_error|context length exceeded",
    ),
)

_REQUESTED = re.compile(
    rf"(?:you requested(?: about)?|resulted in|your request has) {_N} (?:input )?tokens",
    re.IGNORECASE,
)
"""What the request came to, where the wording that matched says it in a second sentence
(OpenAI: "However, you requested 131134 tokens"; "your messages resulted in 4294 tokens")."""

CODES = frozenset({"context_length_exceeded", "exceed_context_size_error"})
"""Error codes and types that mean an overflow: OpenAI's ``code``, llama.cpp server's
``type`` (its body also carries ``n_prompt_tokens`` and ``n_ctx``)."""

OTHER_MEANINGS = frozenset({401, 403, 404, 408, 409, 429})
"""Statuses whose own meaning wins over any wording: the key, the permission, the model's
name, a timeout, a conflict, a rate limit (OpenAI's "Request too large ... tokens per min" is a
429 and a rate limit, not the window)."""

_SCANNED = 20_000
"""Characters of a message read: the wordings come first, and a hostile body may be huge."""
_MOST_TOKENS = 10**12
"""A number past this is not a token count (the same bound as `keel.transports.wire`)."""


@dataclass(frozen=True, slots=True)
class Overflow:
    """A refusal recognised as an overflow, and the provider's numbers when it gave them."""

    requested: int | None = None
    limit: int | None = None


def find_overflow(status: int | None, message: str, body: object = None) -> Overflow | None:
    """Whether a failed attempt was the provider refusing a request over the model's window.

    `status` is the HTTP status (None: none, as for the embedded model or a stream's error
    event), `message` the error's text, `body` the decoded error body when there is one
    (``{"error": {...}}`` or the inner object; its ``code``/``type`` and llama.cpp's
    ``n_prompt_tokens``/``n_ctx`` are read from it). None when it was something else."""
    if status in OTHER_MEANINGS:
        return None
    fields = _error_fields(body)
    text = message[:_SCANNED]
    coded = any(isinstance(fields.get(k), str) and fields[k] in CODES for k in ("code", "type"))
    for wording in WORDINGS:
        match = wording.pattern.search(text)
        if match is not None:
            return _numbers(match, text, fields)
    if not coded:
        return None
    return Overflow(_count(fields.get("n_prompt_tokens")), _count(fields.get("n_ctx")))


def as_overflow(error: ProviderError, body: object = None) -> ProviderError:
    """`error` as a `ContextOverflow` (same message and status) when `find_overflow` says it is
    one, else `error` itself."""
    if isinstance(error, ContextOverflow):
        return error
    found = find_overflow(error.status, error.message, body)
    if found is None:
        return error
    return ContextOverflow(
        error.message, status=error.status, requested=found.requested, limit=found.limit
    )


def _numbers(match: re.Match[str], text: str, fields: Mapping[str, object]) -> Overflow:
    groups = match.groupdict()
    limit = _either(_count(groups.get("limit")), _count(fields.get("n_ctx")))
    requested = _either(_count(groups.get("requested")), _count(fields.get("n_prompt_tokens")))
    prompt, output = _count(groups.get("input")), _count(groups.get("output"))
    if requested is None and prompt is not None and output is not None:
        requested = prompt + output
    if requested is None and "requested" not in groups:
        said = _REQUESTED.search(text)
        requested = _count(said.group(1)) if said else None
    return Overflow(requested, limit)


def _either(first: int | None, second: int | None) -> int | None:
    return first if first is not None else second


def _error_fields(body: object) -> Mapping[str, object]:
    """The error object of a body: ``body["error"]`` when that is an object, else the body."""
    if not isinstance(body, Mapping):
        return {}
    inner = body.get("error")
    return inner if isinstance(inner, Mapping) else body


def _count(value: object) -> int | None:
    """A token count from a group's text or a body's field; None when it is not one."""
    if isinstance(value, str):
        digits = value.replace(",", "")
        plain = digits.isascii() and digits.isdigit() and len(digits) <= 13
        value = int(digits) if plain else None
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if 0 <= value <= _MOST_TOKENS else None
