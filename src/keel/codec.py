"""JSON for the dataclasses Keel stores, derived from their fields: one codec, no field lists.

    to_json(state)                  -> {"step": 3, "usage": {...}, "failure": null, ...}
    from_json(RunState, data)       -> RunState(step=3, usage=Usage(...), ...)

Encoding walks the fields; decoding reads each field's annotation (a nested dataclass, a tuple
or dict of them, an optional, a string enumeration) and rebuilds the value. A new field needs no
edit here: it round-trips by its type, and a store written before the field existed gives it the
field's default. Decoding is tolerant of older stores: a nested dataclass may come as a list of
its fields in order (how `Usage` was once written), unknown keys are ignored, an enumeration
value this version does not know is kept as its text, and a null where the field's type admits
none gives the field's default (when it has one).

Two marks on a field (``field(metadata=...)``) change how it is stored, never what it holds:

- `OMIT_EMPTY`: left out while it is None or an empty container (read back as its default);
- `FLAT`: a dict stored as the object's own keys, beside the other fields (which win a clash);
  every key the class does not name is read back into it.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from enum import Enum
from typing import Any, TypeVar, Union

__all__ = ["FLAT", "OMIT_EMPTY", "from_json", "to_json"]

T = TypeVar("T")

_MARK = "keel.codec"
OMIT_EMPTY: typing.Mapping[str, str] = types.MappingProxyType({_MARK: "omit_empty"})
"""Field metadata: the field is not written while it is None or empty."""
FLAT: typing.Mapping[str, str] = types.MappingProxyType({_MARK: "flat"})
"""Field metadata: the dict's keys are written beside the object's fields, and read back."""


def to_json(value: Any) -> Any:
    """A dataclass (or anything inside one) as plain JSON values."""
    if isinstance(value, Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        marks = _marks(type(value))
        if marks is None:
            return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return _marked(value, marks)
    if isinstance(value, tuple | list):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    return value


def _marked(value: Any, marks: dict[str, str]) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    data: dict[str, Any] = {}
    for f in dataclasses.fields(value):
        item = to_json(getattr(value, f.name))
        mark = marks.get(f.name)
        if mark == "flat":
            flat = dict(item)
        elif mark != "omit_empty" or (item is not None and item != [] and item != {}):
            data[f.name] = item
    return {**flat, **data} if flat else data


_MARKS: dict[type[Any], dict[str, str] | None] = {}


def _marks(cls: type[Any]) -> dict[str, str] | None:
    """The class's marked fields by name, None when it has none (the common case)."""
    try:
        return _MARKS[cls]
    except KeyError:
        found = {f.name: f.metadata[_MARK] for f in dataclasses.fields(cls) if _MARK in f.metadata}
        _MARKS[cls] = marks = found or None
        return marks


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
        data = dict(zip((name for name, _, _ in plan), data, strict=False))
    if not isinstance(data, dict):
        return data
    values = {
        name: _decode(hint, data[name])
        for name, hint, keeps_null in plan
        if name in data and (keeps_null or data[name] is not None)
    }
    marks = _marks(cls)
    for name, mark in (marks or {}).items():
        if mark == "flat":
            named = {n for n, _, _ in plan}
            values[name] = {k: v for k, v in data.items() if k not in named}
    return cls(**values)


_PLANS: dict[type[Any], tuple[tuple[str, Any, bool], ...]] = {}


def _plan(cls: type[Any]) -> tuple[tuple[str, Any, bool], ...]:
    """Each init field, its annotation and whether a stored null is kept (its type admits
    None, or it has no default to fall back on), evaluated once per class; the JSON aliases
    stand for any JSON value."""
    plan = _PLANS.get(cls)
    if plan is None:
        hints = typing.get_type_hints(cls, localns={"JsonObject": Any, "JsonValue": Any})
        plan = tuple(
            (f.name, hints[f.name], _nullable(hints[f.name]) or not _has_default(f))
            for f in dataclasses.fields(cls)
            if f.init
        )
        _PLANS[cls] = plan
    return plan


def _has_default(f: dataclasses.Field[Any]) -> bool:
    return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING


def _nullable(tp: Any) -> bool:
    if tp is Any or tp is type(None):
        return True
    return typing.get_origin(tp) in (Union, types.UnionType) and type(None) in typing.get_args(tp)
