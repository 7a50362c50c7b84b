"""A JSON Schema from outside, checked before it is used and validated bounded (ADR 0048,
ADR 0062): one path for every schema Keel did not write.

A schema comes from the caller (`Agent(output_type=...)`), a file (`keel run --output-schema`),
a stored run's settings, an MCP server's tool (its `inputSchema`), or the record of a paused
call (against which edited arguments are checked), and the JSON Schema validator would follow
it anywhere: a `$ref` to a URL or a file, a `$ref` cycle that applies a schema to the same
value for ever, a `pattern` that Python's backtracking `re` takes exponential time over. So
before it is used (`check_schema`, `checked_validator`):

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

And when a value is validated (`validation_errors`, in `in_thread` or `off_loop`): the
validator has a registry that retrieves nothing, its `pattern`, `patternProperties` and
`additionalProperties` match with RE2, and every keyword of every subschema first looks at a
per-thread clock, so a validation whose branches multiply stops at its time; `in_thread` and
`off_loop` run it in a daemon thread of its own, so neither the event loop nor an ending
process waits for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, cast
from urllib.parse import unquote

from keel.errors import ConfigError

__all__ = [
    "MAX_SCHEMA_DEPTH",
    "MAX_VALUE_DEPTH",
    "VALIDATION_SECONDS",
    "ValidationTooCostly",
    "bounded_validator",
    "check_schema",
    "checked_validator",
    "in_thread",
    "off_loop",
    "re2_pattern",
    "validation_errors",
    "value_depth",
]

T = TypeVar("T")

MAX_SCHEMA_DEPTH = 64
"""How deep the schema document may nest (objects and arrays): more than any hand-written or
pydantic schema, well short of what the validator's recursion can take."""
MAX_PATTERN_CHARS = 2000
_PROGRAM_MEMORY = 16 << 20
"""RE2's limit on one compiled pattern (as `search_files`' patterns have)."""
MAX_VALUE_DEPTH = 64
"""How deep a value validated against a schema from outside may nest (an answer, tool
arguments): the validator recurses a few Python frames per level, and 64 levels stay well
inside the interpreter's recursion limit while no real value comes close."""
VALIDATION_SECONDS = 2.0
"""How long one validation may take. A real value takes milliseconds; a schema whose branches
multiply (anyOf in anyOf...) can take longer than any run has, and is cut off here."""

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
_DRAFT3_IN_PLACE = ("extends", "disallow", "type")
"""Draft 3's keywords that may hold schemas applied to the value itself: `extends` (a schema
or a list), `disallow` and `type` (lists that may hold schemas beside type names)."""


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


def check_schema(schema: dict[str, Any], id_of: Any, what: str = "the output schema") -> None:
    """Refuse what the module docstring lists; `id_of` is the schema dialect's id keyword
    reader (the validator class's ``ID_OF``); `what` names the schema in the refusal."""
    if value_depth(schema, MAX_SCHEMA_DEPTH) > MAX_SCHEMA_DEPTH:
        raise ConfigError(
            f"{what} is nested more than {MAX_SCHEMA_DEPTH} levels deep; name the "
            'repeated parts in "$defs" and point at them with "$ref"'
        )
    nodes = list(_schemas("#", schema))
    anchors = {n["$anchor"]: n for _, n in nodes if isinstance(n.get("$anchor"), str)}
    seen = {id(node) for _, node in nodes}
    for where, node in nodes:  # grows: a $ref may point where no keyword holds a schema
        if "$ref" in node:
            target = _target(schema, anchors, node["$ref"], f"{what}'s {where}")
            if isinstance(target, dict) and id(target) not in seen:
                more = [n for n in _schemas(str(node["$ref"]), target) if id(n[1]) not in seen]
                seen.update(id(n) for _, n in more)
                nodes.extend(more)
    has_pattern_properties = False
    has_unevaluated = False
    for where, node in nodes:
        if node is not schema and id_of(node) is not None:
            raise ConfigError(
                f"{what}'s {where} has its own id ({id_of(node)!r}); only the top of a "
                "schema from outside may have one"
            )
        for keyword in _REFUSED:
            if keyword in node:
                raise ConfigError(
                    f"{what}'s {where} uses {keyword}, which Keel does not support in a "
                    'schema from outside; use "$ref" to a schema in "$defs"'
                )
        if isinstance(node.get("pattern"), str):
            _compiles(node["pattern"], f"{what}'s {where}: pattern")
        if isinstance(node.get("patternProperties"), dict):
            has_pattern_properties = True
            for key in node["patternProperties"]:
                _compiles(str(key), f"{what}'s {where}: a patternProperties key")
        has_unevaluated = has_unevaluated or "unevaluatedProperties" in node
    if has_pattern_properties and has_unevaluated:
        raise ConfigError(
            f"{what} combines patternProperties with unevaluatedProperties, which Keel does "
            "not support in a schema from outside (the validator would match those patterns "
            "with Python's backtracking re); use additionalProperties instead"
        )
    _refuse_cycles(schema, anchors, nodes, what)


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
    for keyword in _DRAFT3_IN_PLACE:
        value = node.get(keyword)
        if keyword == "extends" and isinstance(value, dict):
            yield f"{where}/extends", value
        elif isinstance(value, list):
            schemas = ((i, v) for i, v in enumerate(value) if isinstance(v, dict))
            yield from ((f"{where}/{keyword}/{i}", v) for i, v in schemas)


def _target(root: dict[str, Any], anchors: dict[str, Any], ref: object, where: str) -> Any:
    """What a `$ref` points at in this document; ConfigError for anything else. `where`
    names the schema and the place in it."""
    if not isinstance(ref, str) or not ref.startswith("#"):
        raise ConfigError(
            f"{where} has $ref {ref!r}: a schema's $ref must point inside it "
            '("#/$defs/NAME"); Keel never fetches a schema from a URL or a file'
        )
    fragment = unquote(ref[1:])
    if fragment and not fragment.startswith("/"):
        if fragment in anchors:
            return anchors[fragment]
        raise ConfigError(f"{where} has $ref {ref!r}: no such $anchor")
    node: Any = root
    for part in fragment.split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise ConfigError(f"{where} has $ref {ref!r}, which points nowhere in it")
    if not isinstance(node, dict | bool):
        raise ConfigError(f"{where} has $ref {ref!r}, not to a schema")
    return node


def _refuse_cycles(
    root: dict[str, Any],
    anchors: dict[str, Any],
    nodes: list[tuple[str, dict[str, Any]]],
    what: str,
) -> None:
    """A schema that reaches itself through schemas applied to the same value (refs and
    in-place keywords) loops for ever on any value: refused, naming the loop."""
    names = {id(node): where for where, node in nodes}
    edges: dict[int, list[Any]] = {}
    for where, node in nodes:
        out = [child for _, child in _children(where, node, in_place_only=True)]
        if "$ref" in node:
            out.append(_target(root, anchors, node["$ref"], f"{what}'s {where}"))
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
                    f"{what} has a $ref cycle that never reaches a part of the "
                    f"value: {' -> '.join([*loop, names[id(step)]])}; a recursive schema must "
                    'go through "items" or "properties" on its way back'
                )
            if id(step) not in done:
                path.append(step)
                on_path.add(id(step))
                pending.append(iter(edges[id(step)]))


def _compiles(pattern: str, where: str) -> None:
    if len(pattern) > MAX_PATTERN_CHARS:
        raise ConfigError(f"{where} is {len(pattern)} characters; the limit is {MAX_PATTERN_CHARS}")
    import re2

    try:
        re2_pattern(pattern)
    except re2.error as exc:
        detail = exc.args[0] if exc.args else exc
        if isinstance(detail, bytes):
            detail = detail.decode("utf-8", errors="replace")
        raise ConfigError(
            f"{where} {pattern!r} is not a pattern RE2 can take ({detail}); the patterns of a "
            "schema from outside use RE2 syntax: no backreferences or lookaround"
        ) from None


def _escape(key: object) -> str:
    return str(key).replace("~", "~0").replace("/", "~1")


# --- validating, bounded: no retrieval, RE2 for patterns, a clock every keyword looks at ----


class ValidationTooCostly(TimeoutError):
    """Validating one value took longer than it was given (`in_thread`, `off_loop`)."""


def checked_validator(schema: dict[str, Any], what: str) -> Any:
    """The bounded validator of a schema from outside, once it passes `check_schema` and its
    dialect's metaschema; a ConfigError naming `what` otherwise. Nothing is retrieved: a
    `$ref` must point inside the schema, and the validator's registry fetches nothing."""
    import jsonschema  # only schemas from outside pay for importing it (ADR 0042)
    from referencing import Registry

    if not isinstance(schema, dict):
        raise ConfigError(f"{what} is not a JSON object")
    dialect = jsonschema.validators.validator_for(schema)
    check_schema(schema, dialect.ID_OF, what)  # type: ignore[attr-defined]  # bounds the nesting first
    try:
        dialect.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise ConfigError(f"{what} is not a valid JSON Schema: {exc.message}") from None
    return _bounded(dialect)(schema, registry=Registry())


def bounded_validator(schema: dict[str, Any]) -> Any:
    """The bounded validator of a schema `checked_validator` has passed before (without
    checking it again)."""
    import jsonschema
    from referencing import Registry

    return _bounded(jsonschema.validators.validator_for(schema))(schema, registry=Registry())


def validation_errors(validator: Any, value: Any) -> list[Any]:
    """The validator's errors for `value`, in the order of where they are; raises
    ValidationTooCostly when the thread's clock (`in_thread`, `off_loop`) runs out."""
    from referencing.exceptions import Unresolvable

    try:
        return sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))
    except _OutOfTime:
        raise ValidationTooCostly("validating took too long") from None
    except Unresolvable as exc:  # checked schemas point only inside: kept as a last guard
        raise ConfigError(f"the schema's $ref {exc} cannot be followed") from None


def in_thread(work: Callable[[], T], seconds: float = VALIDATION_SECONDS) -> T:
    """`work()` in a daemon thread whose clock stops validations at `seconds`; waits for it
    from any thread but an event loop's (`off_loop` is for that). ValidationTooCostly past
    `seconds` (and a second more, for work the clock does not reach)."""
    box: list[Any] = []
    finished = threading.Event()

    def deliver(outcome: Any) -> None:
        box.append(outcome)
        finished.set()

    _start(work, seconds, deliver)
    if not finished.wait(seconds + 1.0):
        raise ValidationTooCostly(f"validating took over {seconds:g}s")
    return cast(T, _outcome(box[0]))


async def off_loop(work: Callable[[], T], seconds: float = VALIDATION_SECONDS) -> T:
    """`in_thread` for a coroutine: the event loop goes on while `work` runs."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Any] = loop.create_future()

    def settle(outcome: Any) -> None:
        if not done.done():
            done.set_result(outcome)

    def deliver(outcome: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(settle, outcome)

    _start(work, seconds, deliver)
    try:  # the thread keeps its own time; this only backs it up (work the clock misses)
        outcome = await asyncio.wait_for(done, seconds + 1.0)
    except TimeoutError:
        raise ValidationTooCostly(f"validating took over {seconds:g}s") from None
    return cast(T, _outcome(outcome))


class _Raised:
    def __init__(self, error: BaseException) -> None:
        self.error = error


def _outcome(outcome: Any) -> Any:
    if isinstance(outcome, _Raised):
        raise outcome.error
    return outcome


def _start(work: Callable[[], Any], seconds: float, deliver: Callable[[Any], None]) -> None:
    def run() -> None:
        _clock.deadline = time.monotonic() + seconds
        outcome: Any
        try:
            outcome = work()
        except BaseException as exc:  # handed to the waiting side, never lost here
            outcome = _Raised(exc)
        finally:
            _clock.deadline = None
        deliver(outcome)

    threading.Thread(target=run, name="keel-schema-check", daemon=True).start()


_clock = threading.local()
"""The deadline of the validation running in this thread, if any."""


class _OutOfTime(Exception):
    """Raised inside the validator when its thread's deadline has passed."""


Keyword = Callable[[Any, Any, Any, dict[str, Any]], Iterator[Any]]


def _timed(keyword: Keyword) -> Keyword:
    """`keyword` that first looks at the clock: every keyword of every subschema the
    validator applies passes here, so a validation that multiplies stops soon after its time."""

    def timed(validator: Any, value: Any, instance: Any, schema: dict[str, Any]) -> Iterator[Any]:
        deadline = getattr(_clock, "deadline", None)
        if deadline is not None and time.monotonic() > deadline:
            raise _OutOfTime
        yield from keyword(validator, value, instance, schema) or ()

    return timed


def _pattern(validator: Any, pattern: str, instance: Any, schema: dict[str, Any]) -> Iterator[Any]:
    from jsonschema.exceptions import ValidationError

    if validator.is_type(instance, "string") and re2_pattern(pattern).search(instance) is None:
        yield ValidationError(f"{_short(instance)!r} does not match {pattern!r}")


def _pattern_properties(
    validator: Any, patterns: dict[str, Any], instance: Any, schema: dict[str, Any]
) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        compiled = re2_pattern(pattern)
        for key, item in instance.items():
            if compiled.search(key) is not None:
                yield from validator.descend(item, subschema, path=key, schema_path=pattern)


def _additional_properties(
    validator: Any, extra: Any, instance: Any, schema: dict[str, Any]
) -> Iterator[Any]:
    """jsonschema's own, with the patternProperties it weeds out matched by RE2."""
    from jsonschema.exceptions import ValidationError

    if not validator.is_type(instance, "object"):
        return
    properties = schema.get("properties", {})
    patterns = [re2_pattern(p) for p in schema.get("patternProperties", {})]
    extras = [
        key
        for key in instance
        if key not in properties and not any(p.search(key) is not None for p in patterns)
    ]
    if validator.is_type(extra, "object"):
        for key in extras:
            yield from validator.descend(instance[key], extra, path=key)
    elif not extra and extras:
        names = ", ".join(repr(key) for key in sorted(extras))
        yield ValidationError(f"Additional properties are not allowed ({names} unexpected)")


_RE2_KEYWORDS: dict[str, Keyword] = {
    "pattern": _pattern,
    "patternProperties": _pattern_properties,
    "additionalProperties": _additional_properties,
}


@functools.cache
def _bounded(dialect: type) -> type:
    """The dialect's validator with every keyword timed and the pattern keywords on RE2
    (Python's `re` never sees a schema's pattern: `check_schema` refuses the one keyword left
    that would, unevaluatedProperties beside patternProperties)."""
    import jsonschema

    keywords = cast(dict[str, Keyword], dialect.VALIDATORS)  # type: ignore[attr-defined]
    bounded = {name: _timed(_RE2_KEYWORDS.get(name, keyword)) for name, keyword in keywords.items()}
    return cast(type, jsonschema.validators.extend(dialect, bounded))  # type: ignore[no-untyped-call]


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
