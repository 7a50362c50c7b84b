"""An output schema from outside, checked before a run uses it (ADR 0048).

A schema comes from the caller (`Agent(output_type=...)`), a file (`keel run --output-schema`)
or a stored run's settings, and the JSON Schema validator would follow it anywhere: a `$ref` to
a URL or a file, a `$ref` cycle that applies a schema to the same value for ever, a `pattern`
that Python's backtracking `re` takes exponential time over. So before the run starts:

    nesting      the schema document at most MAX_SCHEMA_DEPTH deep (the validator recurses)
    $ref         only "#", "#/json/pointer" or "#anchor" into this same document; never a URL,
                 a file or a name resolved elsewhere, so nothing is ever retrieved
    cycles       a chain of $ref (and allOf/anyOf/oneOf/not/if/then/else...) that comes back to
                 a schema without descending into the value is refused: it never terminates.
                 Recursion that descends (``{"type": "array", "items": {"$ref": "#"}}``) is
                 legitimate and kept; the answer's depth bounds it (keel/structured.py)
    patterns     every `pattern` and `patternProperties` key compiled with RE2, as
                 `search_files` compiles a model's pattern; one RE2 cannot take is refused
    $id          only at the top (a nested one would move where its $refs point);
                 $dynamicRef and $recursiveRef are refused

Everything is walked by keyword position, so a property named "pattern" or "$ref" is a name,
not a keyword. Each refusal is a ConfigError naming what to change.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote

from keel.errors import ConfigError

__all__ = ["MAX_SCHEMA_DEPTH", "check_schema", "re2_pattern", "value_depth"]

MAX_SCHEMA_DEPTH = 64
"""How deep the schema document may nest (objects and arrays): more than any hand-written or
pydantic schema, well short of what the validator's recursion can take."""
MAX_PATTERN_CHARS = 2000
_PROGRAM_MEMORY = 16 << 20
"""RE2's limit on one compiled pattern (as `search_files`' patterns have)."""

_ONE = ("additionalItems", "additionalProperties", "contains", "propertyNames",
        "unevaluatedItems", "unevaluatedProperties", "contentSchema")  # fmt: skip
"""Keywords holding one schema, applied to parts of the value."""
_ONE_IN_PLACE = ("not", "if", "then", "else")
"""Keywords holding one schema, applied to the value itself."""
_MANY = ("prefixItems",)
_MANY_IN_PLACE = ("allOf", "anyOf", "oneOf")
_MAPS = ("properties", "patternProperties", "$defs", "definitions")
_MAPS_IN_PLACE = ("dependentSchemas", "dependencies")
_REFUSED = ("$dynamicRef", "$recursiveRef")


def value_depth(value: Any, limit: int) -> int:
    """How deep a JSON value nests (a scalar is 0), counted without recursion; stops
    counting past `limit` (returns limit + 1)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > limit:
                return limit + 1
            deepest = max(deepest, depth)
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return deepest


@functools.lru_cache(maxsize=512)
def re2_pattern(pattern: str) -> Any:
    """`pattern` compiled by RE2 (linear time, no backtracking); re2.error when it cannot be.
    Matched unanchored, as JSON Schema's `pattern` is."""
    import re2  # only schemas with patterns pay for the binding (ADR 0042)

    options = re2.Options()
    options.log_errors = False  # RE2 would print parse errors on the process's stderr
    options.max_mem = _PROGRAM_MEMORY
    return re2.compile(pattern, options=options)


def check_schema(schema: dict[str, Any], id_of: Any) -> None:
    """Refuse what the module docstring lists; `id_of` is the schema dialect's id keyword
    reader (the validator class's ``ID_OF``)."""
    if value_depth(schema, MAX_SCHEMA_DEPTH) > MAX_SCHEMA_DEPTH:
        raise ConfigError(
            f"the output schema is nested more than {MAX_SCHEMA_DEPTH} levels deep; name the "
            'repeated parts in "$defs" and point at them with "$ref"'
        )
    nodes = list(_schemas("#", schema))
    anchors = {n["$anchor"]: n for _, n in nodes if isinstance(n.get("$anchor"), str)}
    seen = {id(node) for _, node in nodes}
    for where, node in nodes:  # grows: a $ref may point where no keyword holds a schema
        if "$ref" in node:
            target = _target(schema, anchors, node["$ref"], where)
            if isinstance(target, dict) and id(target) not in seen:
                more = [n for n in _schemas(str(node["$ref"]), target) if id(n[1]) not in seen]
                seen.update(id(n) for _, n in more)
                nodes.extend(more)
    has_pattern_properties = False
    has_unevaluated = False
    for where, node in nodes:
        if node is not schema and id_of(node) is not None:
            raise ConfigError(
                f"the output schema's {where} has its own id ({id_of(node)!r}); only the top "
                "of an output schema may have one"
            )
        for keyword in _REFUSED:
            if keyword in node:
                raise ConfigError(
                    f"the output schema's {where} uses {keyword}, which output schemas do not "
                    'support; use "$ref" to a schema in "$defs"'
                )
        if isinstance(node.get("pattern"), str):
            _compiles(node["pattern"], f"{where}: pattern")
        if isinstance(node.get("patternProperties"), dict):
            has_pattern_properties = True
            for key in node["patternProperties"]:
                _compiles(str(key), f"{where}: a patternProperties key")
        has_unevaluated = has_unevaluated or "unevaluatedProperties" in node
    if has_pattern_properties and has_unevaluated:
        raise ConfigError(
            "the output schema combines patternProperties with unevaluatedProperties, which "
            "output schemas do not support (the validator would match those patterns with "
            "Python's backtracking re); use additionalProperties instead"
        )
    _refuse_cycles(schema, anchors, nodes)


def _schemas(where: str, root: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(JSON pointer, schema) for every schema object under `root`, by keyword position."""
    stack: list[tuple[str, Any]] = [(where, root)]
    while stack:
        where, node = stack.pop()
        if not isinstance(node, dict):
            continue  # a boolean schema, or a value where a schema was expected
        yield where, node
        stack.extend(_children(where, node, in_place_only=False))


def _children(
    where: str, node: dict[str, Any], *, in_place_only: bool
) -> Iterator[tuple[str, Any]]:
    """The schemas a schema holds; `in_place_only`: only those applied to the same value."""
    one = _ONE_IN_PLACE if in_place_only else (*_ONE, *_ONE_IN_PLACE)
    many = _MANY_IN_PLACE if in_place_only else (*_MANY, *_MANY_IN_PLACE)
    maps = _MAPS_IN_PLACE if in_place_only else (*_MAPS, *_MAPS_IN_PLACE)
    for keyword in one:
        if keyword in node:
            yield f"{where}/{keyword}", node[keyword]
    items = node.get("items")
    if not in_place_only and isinstance(items, dict | bool):
        yield f"{where}/items", items
    for keyword in many:
        value = node.get(keyword)
        if keyword == "prefixItems" and isinstance(items, list):
            value = items  # draft 4 to 7: items as a list is prefixItems
        if isinstance(value, list):
            yield from ((f"{where}/{keyword}/{i}", v) for i, v in enumerate(value))
    for keyword in maps:
        value = node.get(keyword)
        if isinstance(value, dict):
            yield from ((f"{where}/{keyword}/{_escape(k)}", v) for k, v in value.items())


def _target(root: dict[str, Any], anchors: dict[str, Any], ref: object, where: str) -> Any:
    """What a `$ref` points at in this document; ConfigError for anything else."""
    if not isinstance(ref, str) or not ref.startswith("#"):
        raise ConfigError(
            f"the output schema's {where} has $ref {ref!r}: an output schema's $ref must point "
            'inside it ("#/$defs/NAME"); Keel never fetches a schema from a URL or a file'
        )
    fragment = unquote(ref[1:])
    if fragment and not fragment.startswith("/"):
        if fragment in anchors:
            return anchors[fragment]
        raise ConfigError(f"the output schema's {where} has $ref {ref!r}: no such $anchor")
    node: Any = root
    for part in fragment.split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise ConfigError(
                f"the output schema's {where} has $ref {ref!r}, which points nowhere in it"
            )
    if not isinstance(node, dict | bool):
        raise ConfigError(f"the output schema's {where} has $ref {ref!r}, not to a schema")
    return node


def _refuse_cycles(
    root: dict[str, Any], anchors: dict[str, Any], nodes: list[tuple[str, dict[str, Any]]]
) -> None:
    """A schema that reaches itself through schemas applied to the same value (refs and
    in-place keywords) loops for ever on any value: refused, naming the loop."""
    names = {id(node): where for where, node in nodes}
    edges: dict[int, list[Any]] = {}
    for where, node in nodes:
        out = [child for _, child in _children(where, node, in_place_only=True)]
        if "$ref" in node:
            out.append(_target(root, anchors, node["$ref"], where))
        edges[id(node)] = [child for child in out if isinstance(child, dict)]
    done: set[int] = set()
    for _, start in nodes:
        if id(start) in done:
            continue
        path, on_path = [start], {id(start)}
        pending = [iter(edges[id(start)])]
        while pending:
            step = next(pending[-1], None)
            if step is None:
                done.add(id(path[-1]))
                on_path.discard(id(path.pop()))
                pending.pop()
                continue
            if id(step) in on_path:
                loop = [names[id(n)] for n in path[[id(n) for n in path].index(id(step)) :]]
                raise ConfigError(
                    f"the output schema has a $ref cycle that never reaches a part of the "
                    f"value: {' -> '.join([*loop, names[id(step)]])}; a recursive schema must "
                    'go through "items" or "properties" on its way back'
                )
            if id(step) not in done:
                path.append(step)
                on_path.add(id(step))
                pending.append(iter(edges[id(step)]))


def _compiles(pattern: str, where: str) -> None:
    if len(pattern) > MAX_PATTERN_CHARS:
        raise ConfigError(
            f"the output schema's {where} is {len(pattern)} characters; the limit is "
            f"{MAX_PATTERN_CHARS}"
        )
    import re2

    try:
        re2_pattern(pattern)
    except re2.error as exc:
        detail = exc.args[0] if exc.args else exc
        if isinstance(detail, bytes):
            detail = detail.decode("utf-8", errors="replace")
        raise ConfigError(
            f"the output schema's {where} {pattern!r} is not a pattern RE2 can take ({detail}); "
            "output schema patterns use RE2 syntax: no backreferences or lookaround"
        ) from None


def _escape(key: object) -> str:
    return str(key).replace("~", "~0").replace("/", "~1")
