"""Call keys: what makes two tool calls "identical" for the breaker.

A call key is the tool name plus the canonical JSON of the arguments: keys sorted, no
insignificant white space, and equal numbers written one way (``1``, ``1.0`` and ``1e0`` are
one number). Numbers in a model's text are compared exactly (as decimals), so digits past a
float's precision or range still tell two calls apart. Arguments that are not valid JSON, or
too deeply nested to compare, keep their raw text, so a model repeating the same broken call is
still seen repeating.
"""

from __future__ import annotations

import json
import math
from decimal import Decimal
from typing import Any

__all__ = [
    "call_key",
    "canonical_json",
    "key_from_text",
    "parse_arguments",
    "raw_call_key",
]

_PLAIN_INTEGER_DIGITS = 4000
"""Whole numbers are written with all their digits (below Python's int-parsing limit)."""
_PLAIN_FRACTION_DIGITS = 21
"""Fractions with up to this many decimals are written plainly; finer ones in e notation."""


def _number(value: Decimal) -> str:
    if not value.is_finite():
        return "NaN" if value.is_nan() else ("-Infinity" if value < 0 else "Infinity")
    if value == 0:
        return "0"
    value = value.normalize()
    _, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)
    if exponent >= 0 and len(digits) + exponent <= _PLAIN_INTEGER_DIGITS:
        return format(value, "f")
    if -_PLAIN_FRACTION_DIGITS <= exponent < 0 and len(digits) + exponent <= _PLAIN_FRACTION_DIGITS:
        return format(value, "f")
    return str(value).replace("E", "e")


def _dump(value: Any) -> str:
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, int):
        return _number(Decimal(value))
    if isinstance(value, float):
        return _number(Decimal(repr(value)) if math.isfinite(value) else Decimal(value))
    if isinstance(value, Decimal):
        return _number(value)
    if isinstance(value, dict):
        items = sorted((str(k), v) for k, v in value.items())
        return "{" + ",".join(f"{_dump(k)}:{_dump(v)}" for k, v in items) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(_dump(v) for v in value) + "]"
    raise TypeError(f"not a JSON value: {type(value).__name__}")


def canonical_json(value: Any) -> str:
    """One spelling per JSON value, so equal arguments give equal keys."""
    return _dump(value)


def call_key(name: str, arguments: Any) -> str:
    """The key of a call whose arguments are already parsed."""
    try:
        return f"{name} {canonical_json(arguments)}"
    except RecursionError:
        return raw_call_key(name, json.dumps(arguments))


def raw_call_key(name: str, raw_arguments: str) -> str:
    """The key of a call whose arguments did not parse: the raw text, trimmed, stands in."""
    return f"{name} !{raw_arguments.strip()}"


def key_from_text(name: str, raw_arguments: str) -> str:
    """The key of a call as the model wrote it, numbers compared exactly."""
    if raw_arguments.strip() == "":
        return call_key(name, {})
    try:
        exact = json.loads(
            raw_arguments,
            parse_float=Decimal,
            parse_int=Decimal,
            parse_constant=_reject_constant,
        )
        return f"{name} {canonical_json(exact)}"
    except (ValueError, RecursionError):
        return raw_call_key(name, raw_arguments)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"{text} is out of range for a number")
    return number


def parse_arguments(raw: str) -> tuple[Any, str | None]:
    """Parse a model's argument text; return (value, None) or (None, a readable error).

    Strict JSON: NaN and Infinity, which Python would accept, are refused, and so are numbers
    too large for a float (``1e400``, which Python reads as infinity): a tool would get a value
    no JSON can carry, and the approval or result showing it could not be printed as JSON.
    """
    if raw.strip() == "":
        return {}, None
    try:
        return json.loads(raw, parse_constant=_reject_constant, parse_float=_finite_float), None
    except json.JSONDecodeError as exc:
        return None, f"arguments are not valid JSON: {exc.msg} at position {exc.pos}"
    except ValueError as exc:
        return None, f"arguments are not usable JSON: {exc}"
    except RecursionError:
        return None, "arguments are nested too deeply to read"
