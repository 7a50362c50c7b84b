"""Call keys: what makes two tool calls "identical" for the breaker.

A call key is the tool name plus the canonical JSON of the arguments: keys sorted, no
insignificant white space, and equal numbers written one way (``1``, ``1.0`` and ``1e0`` are
one number). Arguments that are not valid JSON keep their raw text, so a model repeating the
same broken call is still seen repeating.
"""

from __future__ import annotations

import json
import math
from typing import Any


def _normalise(value: Any) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if math.isfinite(value) and value == int(value):
            return int(value)
        return value
    if isinstance(value, dict):
        return {str(k): _normalise(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_normalise(v) for v in value]
    raise TypeError(f"not a JSON value: {type(value).__name__}")


def canonical_json(value: Any) -> str:
    """One spelling per JSON value, so equal arguments give equal keys."""
    return json.dumps(
        _normalise(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )


def call_key(name: str, arguments: Any) -> str:
    """The key of a call whose arguments parsed as JSON."""
    return f"{name} {canonical_json(arguments)}"


def raw_call_key(name: str, raw_arguments: str) -> str:
    """The key of a call whose arguments did not parse: the raw text, trimmed, stands in."""
    return f"{name} !{raw_arguments.strip()}"


def parse_arguments(raw: str) -> tuple[Any, str | None]:
    """Parse a model's argument text; return (value, None) or (None, a readable error)."""
    if raw.strip() == "":
        return {}, None
    try:
        return json.loads(raw), None
    except json.JSONDecodeError as exc:
        return None, f"arguments are not valid JSON: {exc.msg} at position {exc.pos}"
