"""Reading what a provider sends: strict JSON, declared shapes, token counts.

A response body is untrusted input, like a fetched page. Each transport declares the shape of
the fields it reads (a `Shape`, pydantic) and `parse` checks a decoded body against it, so a
field of the wrong type (a ``finish_reason`` that is an object, ``usage`` that is a string) is a
`ProviderError` naming the field, raised at the transport boundary, and never a ``TypeError``
somewhere in the run loop. The shapes say only what Keel reads, and as loosely as providers
really differ (a missing ``usage`` is zero, unknown fields and item types are ignored); what
they do say is checked.

Such an error is **not retryable**: a server that sends a malformed shape sends it again (it is
a bug, a proxy or an attack), and each retry would spend a model call of the budget on it.

Numbers JSON cannot carry (``NaN``, ``Infinity``, ``1e400``, which Python's own decoder turns
into floats) are decoded as `NonFinite` markers that no declared type accepts, so they fail
where they stand, named like any other wrong type, and never reach the budgets or the store.
Token counts are `TokenCount`: integers (not floats, not booleans), from 0 to
`MAX_REPORTED_TOKENS`.

An error object sent with HTTP 200 (LiteLLM's proxy answers Anthropic's ``/v1/messages`` so:
``{"type": "error", "error": {...}}``; OpenAI-style ``{"error": {...}}`` the same way) is the
provider's error, with its own message, and never an empty turn (`error_in_body`, ADR 0035).
"""

from __future__ import annotations

import json
import math
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError, model_validator

from keel.errors import ProviderError
from keel.transports.base import MAX_REPORTED_TOKENS
from keel.transports.policy import is_retryable, shorten

__all__ = [
    "MAX_REPORTED_TOKENS",
    "RETRYABLE_ERROR_TYPES",
    "NonFinite",
    "Opaque",
    "Shape",
    "TokenCount",
    "decode_json",
    "error_in_body",
    "parse",
]

TokenCount = Annotated[int, Field(strict=True, ge=0, le=MAX_REPORTED_TOKENS)]

_SHOWN_ERRORS = 3
"""How many wrong fields one message names (the rest are counted)."""

_S = TypeVar("_S", bound=BaseModel)


class NonFinite:
    """A number in a body that no float can hold (NaN, Infinity, out of range), kept as the text
    it was, so that no declared field type accepts it."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


class Shape(BaseModel):
    """A provider's object as Keel reads it: the declared fields are checked, the rest ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True)


class Opaque(Shape):
    """An object Keel keeps whole and sends back unchanged (Anthropic's thinking blocks, OpenAI's
    reasoning items): checked to be JSON, every number finite, and kept as it came."""

    raw: dict[str, JsonValue]

    @model_validator(mode="before")
    @classmethod
    def _whole(cls, data: Any) -> Any:
        return {"raw": data}


def decode_json(body: bytes | str, provider: str) -> dict[str, Any]:
    """A successful response's JSON object. A 200 that is not JSON (a proxy's or a web UI's page
    at a wrong base URL) is not fixed by waiting, so it fails at once."""
    try:
        data = json.loads(body, parse_constant=NonFinite, parse_float=_float)
    except (ValueError, RecursionError):
        data = None
    if not isinstance(data, dict):
        shown = body if isinstance(body, str) else body[:400].decode("utf-8", "replace")
        raise ProviderError(f"{provider}: the response is not a JSON object: {shown[:200]!r}")
    error = error_in_body(data, provider)
    if error is not None:
        raise error
    return data


RETRYABLE_ERROR_TYPES = frozenset(
    {"api_error", "overloaded_error", "rate_limit_error", "server_error", "timeout_error"}
)
"""Error types (Anthropic's and OpenAI's words) that a later attempt may not meet, when an
error comes with HTTP 200 and so without a status to classify it by."""

_ERROR_MESSAGE_CHARS = 500


def error_in_body(data: dict[str, Any], provider: str) -> ProviderError | None:
    """The provider's error when a 200 body is an error object, else None.

    An Anthropic error says ``"type": "error"``; an OpenAI one has an ``error`` and no result
    (a Responses API ``response`` carries ``error`` of its own when it failed, and is read as a
    response). A numeric ``code`` (LiteLLM sends the upstream status there) classifies it like
    that status; otherwise the error's type does (`RETRYABLE_ERROR_TYPES`)."""
    error = data.get("error")
    ordinary = error in (None, "", {}) or data.get("object") == "response"
    if data.get("type") != "error" and ordinary:
        return None
    kind, message, code = "error", "", None
    if isinstance(error, dict):
        kind = _text(error.get("type")) or kind
        message = _text(error.get("message"))
        code = error.get("code")
    elif isinstance(error, str):
        message = error
    status = _status(code)
    retryable = is_retryable(status, _text(code)) if status else kind in RETRYABLE_ERROR_TYPES
    detail = shorten(message.strip() or "(no message)", _ERROR_MESSAGE_CHARS)
    return ProviderError(
        f"{provider}: the server answered HTTP 200 with an error: {kind}: {detail}",
        status=status,
        retryable=retryable,
    )


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _status(code: object) -> int | None:
    text = str(code) if isinstance(code, int | str) and not isinstance(code, bool) else ""
    return int(text) if text.isdigit() and 100 <= int(text) <= 599 else None


def _float(text: str) -> float | NonFinite:
    number = float(text)
    return number if math.isfinite(number) else NonFinite(text)


def parse(shape: type[_S], data: object, provider: str, what: str = "response") -> _S:
    """`data` read as `shape`, or a non-retryable ProviderError naming the wrong fields."""
    try:
        return shape.model_validate(data)
    except ValidationError as exc:
        problems = exc.errors(include_url=False)
    except RecursionError:
        raise ProviderError(f"{provider}: the {what} is nested too deeply to read") from None
    by_path: dict[str, list[Any]] = {}
    for problem in problems:  # a union's members each report: one line per field
        by_path.setdefault(_path(problem["loc"]), []).append(problem)
    named = [f"{path}: {_problem(found)}" for path, found in list(by_path.items())[:_SHOWN_ERRORS]]
    if len(by_path) > len(named):
        named.append(f"and {len(by_path) - len(named)} more")
    raise ProviderError(f"{provider}: the {what} has the wrong shape: {'; '.join(named)}")


_JSON_NAMES = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
_WANTED = {
    "model_type": "an object",
    "dict_type": "an object",
    "string_type": "a string",
    "list_type": "a list",
    "int_type": "an integer",
    "invalid-json-value": "JSON",
}


def _problem(found: list[Any]) -> str:
    """What is wrong with one field, in JSON's words: ``should be a string (got an object)``."""
    value = found[0].get("input")
    if isinstance(value, NonFinite):
        return f"{value.text} is not a finite number"
    if found[0]["type"] == "missing":
        return "missing"
    wanted = [_WANTED[p["type"]] for p in found if p["type"] in _WANTED]
    if not wanted:  # a range or a literal: pydantic's words say it best
        return str(found[0]["msg"]).removeprefix("Input ")
    got = _JSON_NAMES.get(type(value), "a number" if isinstance(value, int | float) else "null")
    return f"should be {' or '.join(dict.fromkeys(wanted))} (got {got})"


_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "none", "dict", "list"})


def _path(loc: tuple[int | str, ...]) -> str:
    """A pydantic location as a JSON path, ``choices[0].message.content``, without the tags
    pydantic adds for union members (``~tool_use``, ``str``, ``list[...]``)."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part == "raw" or part.startswith("~") or part in _TYPE_TAGS or "[" in part:
            continue
        else:
            path += f".{part}" if path else part
    return path or "(the body)"
