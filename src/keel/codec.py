"""JSON for the dataclasses Keel stores, derived from their fields: one codec, no field lists.

    to_json(state)                  -> {"step": 3, "usage": {...}, "failure": null, ...}
    from_json(RunState, data)       -> RunState(step=3, usage=Usage(...), ...)

Encoding walks the fields; decoding reads each field's annotation (a nested dataclass, a tuple
or dict of them, an optional, a string enumeration) and rebuilds the value. A new field needs no
edit here: it round-trips by its type, and a store written before the field existed gives it the
field's default. Decoding is tolerant of older stores: a nested dataclass may come as a list of
its fields in order (how `Usage` was once written), unknown keys are ignored, and an enumeration
value this version does not know is kept as its text.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from enum import Enum
from typing import Any, TypeVar, Union

__all__ = ["from_json", "to_json"]

T = TypeVar("T")


def to_json(value: Any) -> Any:
    """A dataclass (or anything inside one) as plain JSON values."""
    if isinstance(value, Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple | list):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    return value


def from_json(cls: type[T], data: Any) -> T:
    """`cls` rebuilt from what `to_json` wrote (or an older store's form of it)."""
    return typing.cast(T, _decode(cls, data))


def _decode(tp: Any, data: Any) -> Any:
    if data is None:
        return None
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        return _decode(options[0], data) if len(options) == 1 else data
    if origin is tuple and isinstance(data, list | tuple):
        item = typing.get_args(tp)[0]
        return tuple(_decode(item, d) for d in data)
    if origin is dict and isinstance(data, dict):
        item = typing.get_args(tp)[1]
        return {k: _decode(item, v) for k, v in data.items()}
    if isinstance(tp, type) and issubclass(tp, Enum):
        try:
            return tp(data)
        except ValueError:  # written by a newer Keel: kept as its text
            return data
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _decode_dataclass(tp, data)
    return data


def _decode_dataclass(cls: type[Any], data: Any) -> Any:
    plan = _plan(cls)
    if isinstance(data, list | tuple):  # an older store's positional form
        data = dict(zip((name for name, _ in plan), data, strict=False))
    if not isinstance(data, dict):
        return data
    return cls(**{name: _decode(hint, data[name]) for name, hint in plan if name in data})


_PLANS: dict[type[Any], tuple[tuple[str, Any], ...]] = {}


def _plan(cls: type[Any]) -> tuple[tuple[str, Any], ...]:
    """Each init field and its annotation, evaluated once per class; the JSON aliases stand
    for any JSON value."""
    plan = _PLANS.get(cls)
    if plan is None:
        hints = typing.get_type_hints(cls, localns={"JsonObject": Any, "JsonValue": Any})
        plan = tuple((f.name, hints[f.name]) for f in dataclasses.fields(cls) if f.init)
        _PLANS[cls] = plan
    return plan
