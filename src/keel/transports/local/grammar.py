"""Grammars for the embedded model's turns, built from the tools' JSON Schemas (GBNF, llama.cpp's).

llama.cpp can restrict sampling to the strings a grammar accepts. The local transport gives it
one per turn, from `turn_grammar`:

- an ordinary turn (tool_choice None): ``root ::= call | answer``: a call to a declared tool,
  written in Qwen's own ``<tool_call>`` format (or as the bare ``{"name", "arguments"}`` object
  the small model tends to write after a result) with arguments that fit that tool's schema,
  or an answer (text that does not begin with ``<``, ``{`` or a backtick);
- a turn that insists on evidence ("required"): ``root ::= call``;
- a synthesis turn ("none"): ``root ::= answer``. The model cannot write a call there, whatever
  its weights prefer: the rule that a synthesis turn answers is enforced at the sampler.

With an output schema (structured output, keel/structured.py) the answer is not free text but
JSON that fits that schema (`schema_rule` of it), in every kind of turn: the model can only
write a call or the answer in the caller's shape.

A call is one ``<tool_call>`` block (one call per turn: after it the grammar is complete, so
the model must end its turn instead of inventing the result it waits for). Its JSON is written
the way `qwen_format` (beside it) replays calls (``", "`` and ``": "`` separators, required
properties first, then optional ones, each in schema order), so a replayed call is the text the
model wrote and llama.cpp's cached prefix holds.

Schemas: `schema_rule` covers what tool schemas use: object (properties, required,
additionalProperties), string (minLength, maxLength), integer, number, boolean, null, enum,
const, anyOf / oneOf, type lists, array (items, minItems, maxItems) and local ``$ref``
(``#/$defs/...``). Keywords it cannot express (pattern, format, minimum...) are not enforced by
the grammar; the executor still validates every call and answers a mismatch as an error. Every
string is at most `MAX_STRING` characters and every array at most `MAX_ITEMS` items, so a call
always ends: a model cannot run a string on until the output limit cuts it, and a
grammar-constrained call therefore always parses.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from keel.errors import ConfigError
from keel.messages import ToolChoice, ToolDefinition
from keel.transports.local.qwen_format import CALL_CLOSE, CALL_OPEN

__all__ = [
    "ANSWER_RULE",
    "MAX_DEPTH",
    "MAX_ITEMS",
    "MAX_STRING",
    "literal",
    "schema_rule",
    "turn_grammar",
]

MAX_STRING = 200
"""Characters in one string argument (less when the schema's maxLength says so)."""
MAX_ITEMS = 8
"""Items in one array argument (less when the schema's maxItems says so)."""
MAX_DEPTH = 4
"""Nesting of objects and arrays; deeper values (or recursive schemas) are plain scalars."""

ANSWER_RULE = r"[^<{`\x00] [^\x00]*"
"""An answer: any text that does not begin with ``<`` (so never a ``<tool_call>``), ``{`` or a
backtick. After a tool result the 0.5B model writes its next call as bare JSON, ``{"name": ...``
without the tags (98.5% of its first-token probability in the evaluation's scenarios), or in a
code fence: as an answer that is garbage, so a call may be written bare (see `turn_grammar`),
and an answer starts with prose."""

_PRIMITIVES = {
    "string": f'"\\"" char{{0,{MAX_STRING}}} "\\""',
    "char": r'[^"\\\x00-\x1f] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})',
    "integer": r'"-"? ("0" | [1-9] [0-9]{0,18})',
    "number": r'integer ("." [0-9]{1,21})? ([eE] [-+]? [0-9]{1,3})?',  # repr: 0.000 + 17 digits
    "boolean": '"true" | "false"',
    "null": '"null"',
}
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_NAME = re.compile(r"[^A-Za-z0-9-]+")


def literal(text: str) -> str:
    """A GBNF string literal matching exactly `text`."""
    out = []
    for char in text:
        if char in _ESCAPES:
            out.append(_ESCAPES[char])
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\x{ord(char):02x}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def turn_grammar(
    tools: Sequence[ToolDefinition],
    tool_choice: ToolChoice,
    output_schema: Mapping[str, Any] | None = None,
    answer_rule: str = ANSWER_RULE,
) -> str:
    """The GBNF grammar for one turn (pure). Raises ConfigError for "required" without tools.
    `output_schema`: the answer must be JSON that fits it, instead of free text (`answer_rule`,
    by default any prose)."""
    rules = _Rules()
    if tool_choice == "none" or not tools:
        if tool_choice == "required":
            raise ConfigError('tool_choice "required" needs at least one tool')
        rules.add("root", "answer")
    else:
        branches = []
        for tool in tools:
            args = schema_rule(rules, tool.parameters, f"{tool.name}-args")
            head = literal(f"{json.dumps(tool.name)}, " + '"arguments": ')
            branches.append(f"{head} {args}")
        rules.add("call-body", " | ".join(f"( {b} )" for b in branches))
        opening = literal('{"name": ')
        rules.add("call-json", f'{opening} call-body "}}"')
        rules.add("call", f"{literal(CALL_OPEN)} call-json {literal(CALL_CLOSE)} | call-json")
        rules.add("root", "call" if tool_choice == "required" else "call | answer")
    if output_schema is None:
        rules.add("answer", answer_rule)
    else:
        rules.add("answer", schema_rule(rules, output_schema, "output"))
    return rules.text()


class _Rules:
    """Named GBNF rules, in the order added, each name unique."""

    def __init__(self) -> None:
        self.rules: dict[str, str] = {}
        self.root_schema: Mapping[str, Any] = {}

    def add(self, name: str, body: str) -> str:
        name = _NAME.sub("-", name).strip("-").lower() or "rule"
        base, n = name, 1
        while name in self.rules and self.rules[name] != body:
            n += 1
            name = f"{base}-{n}"
        self.rules[name] = body
        return name

    def primitive(self, name: str) -> str:
        if name == "number":
            self.primitive("integer")
        if name == "string":
            self.primitive("char")
        return self.add(name, _PRIMITIVES[name])

    def text(self) -> str:
        return "".join(f"{name} ::= {body}\n" for name, body in self.rules.items())


def schema_rule(rules: _Rules, schema: Any, name: str, depth: int = 0) -> str:
    """A rule (or an expression) matching JSON values that fit `schema`, written compactly."""
    if depth == 0:
        rules.root_schema = schema if isinstance(schema, Mapping) else {}
    if not isinstance(schema, Mapping) or depth > MAX_DEPTH:
        return _any_value(rules, depth)
    if "$ref" in schema:
        return schema_rule(rules, _resolve(rules.root_schema, schema["$ref"]), name, depth + 1)
    if "const" in schema:
        return literal(json.dumps(schema["const"], ensure_ascii=False))
    if "enum" in schema:
        options = [literal(json.dumps(v, ensure_ascii=False)) for v in schema["enum"]]
        return rules.add(name, " | ".join(options)) if options else _any_value(rules, depth)
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            options = [
                schema_rule(rules, option, f"{name}-{i}", depth)
                for i, option in enumerate(schema[key])
            ]
            return rules.add(name, " | ".join(options))
    kind = schema.get("type")
    if isinstance(kind, list):
        options = [schema_rule(rules, {**schema, "type": k}, f"{name}-{k}", depth) for k in kind]
        return rules.add(name, " | ".join(options)) if options else _any_value(rules, depth)
    if kind == "object" or (kind is None and "properties" in schema):
        return _object(rules, schema, name, depth)
    if kind == "array":
        return _array(rules, schema, name, depth)
    if kind == "string":
        return _string(rules, schema, name)
    if kind in ("integer", "number", "boolean", "null"):
        return rules.primitive(kind)
    return _any_value(rules, depth)


def _resolve(root: Mapping[str, Any], ref: Any) -> Any:
    """A local reference (``#/$defs/Name``); anything else is unknown (any value)."""
    if not isinstance(ref, str) or not ref.startswith("#/"):
        return None
    node: Any = root
    for part in ref[2:].split("/"):
        node = node.get(part) if isinstance(node, Mapping) else None
    return node


def _string(rules: _Rules, schema: Mapping[str, Any], name: str) -> str:
    low = _bound(schema.get("minLength"), 0)
    high = min(_bound(schema.get("maxLength"), MAX_STRING), MAX_STRING)
    if (low, high) == (0, MAX_STRING):
        return rules.primitive("string")
    rules.primitive("char")
    return rules.add(name, f'"\\"" char{{{min(low, high)},{high}}} "\\""')


def _array(rules: _Rules, schema: Mapping[str, Any], name: str, depth: int) -> str:
    item = schema_rule(rules, schema.get("items", {}), f"{name}-item", depth + 1)
    high = min(_bound(schema.get("maxItems"), MAX_ITEMS), MAX_ITEMS)
    low = min(_bound(schema.get("minItems"), 0), high)
    if high == 0:
        return literal("[]")
    more = f'( ", " {item} ){{{max(low - 1, 0)},{high - 1}}}'
    body = f'"[" {item} {more} "]"'
    return rules.add(name, body if low > 0 else f'{body} | "[]"')


def _object(rules: _Rules, schema: Mapping[str, Any], name: str, depth: int) -> str:
    properties = schema.get("properties")
    if not isinstance(properties, Mapping) or not properties:
        if schema.get("additionalProperties") is False:
            return literal("{}")
        return _any_object(rules, depth)
    required = set(schema.get("required") or ())
    members = []
    for key, sub in properties.items():
        value = schema_rule(rules, sub, f"{name}-{key}", depth + 1)
        members.append((key in required, f"{literal(json.dumps(key) + ': ')} {value}"))
    first = [m for needed, m in members if needed]
    rest = [m for needed, m in members if not needed]
    if first:
        body = ' ", " '.join(first) + "".join(f' ( ", " {m} )?' for m in rest)
        return rules.add(name, f'"{{" {body} "}}"')
    starts = [
        " ".join([m, *(f'( ", " {later} )?' for later in rest[i + 1 :])])
        for i, m in enumerate(rest)
    ]
    return rules.add(name, '"{" ( ' + " | ".join(f"( {s} )" for s in starts) + ' )? "}"')


def _any_value(rules: _Rules, depth: int) -> str:
    """Any JSON value nested at most to `MAX_DEPTH` (scalars only past it)."""
    scalars = [rules.primitive(k) for k in ("string", "number", "boolean", "null")]
    if depth >= MAX_DEPTH:
        return rules.add("scalar", " | ".join(scalars))
    nested = [_any_object(rules, depth), _any_array(rules, depth)]
    return rules.add(f"value-{depth}", " | ".join([*nested, *scalars]))


def _any_object(rules: _Rules, depth: int) -> str:
    string = rules.primitive("string")
    value = _any_value(rules, depth + 1)
    pair = f'{string} ": " {value}'
    more = f'( ", " {pair} ){{0,{MAX_ITEMS - 1}}}'
    return rules.add(f"object-{depth}", f'"{{" ( {pair} {more} )? "}}"')


def _any_array(rules: _Rules, depth: int) -> str:
    value = _any_value(rules, depth + 1)
    more = f'( ", " {value} ){{0,{MAX_ITEMS - 1}}}'
    return rules.add(f"array-{depth}", f'"[" ( {value} {more} )? "]"')


def _bound(value: Any, default: int) -> int:
    usable = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return value if usable else default
