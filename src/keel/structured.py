"""Structured output: the answer in the shape the caller asked for, validated (ADR 0034).

    Agent(output_type=Report)             a pydantic model: the answer is a validated Report
    Agent(output_type={"type": ...})      a JSON Schema: the answer is validated JSON
    keel run --output-schema FILE         a JSON Schema file

Each request of the run carries the schema (`ModelRequest.output`), and each transport asks for
it in its provider's own form (OpenAI's json_schema formats, an answer tool for Anthropic, a
grammar for the local model, instructions for the XML fallback). Whatever the provider does,
the answer is validated here: by pydantic for a model, by the JSON Schema validator for a
schema. A turn whose answer does not validate gets the errors back and one more turn (at most
`Limits.output_retries`, and only while the budgets allow a model call); a synthesis turn asks
for an envelope around the same schema, ``{"output": <the schema>, "gaps": [...]}``, so a forced
answer is still the caller's shape and says what it could not fill in (`partial`); a synthesis
answer in the bare schema is taken too, with no gaps named. An answer that cannot be validated
even then ends the run InvalidOutput, with the model's text kept.

A JSON Schema from outside is checked before the run (keel/schema_checks.py: local `$ref`s
only, no cycles, RE2 patterns), and validation is bounded (ADR 0048): the answer at most
MAX_ANSWER_DEPTH deep, its patterns matched by RE2, and `check_bounded` validates in a thread
of its own that gives up after VALIDATION_SECONDS, so the event loop, a deadline and a signal
are never kept waiting.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

import pydantic

from keel.errors import ConfigError
from keel.messages import OutputSchema
from keel.schema_checks import (
    MAX_VALUE_DEPTH,
    VALIDATION_SECONDS,
    ValidationTooCostly,
    bounded_validator,
    checked_validator,
    off_loop,
    validation_errors,
    value_depth,
)

__all__ = [
    "GAPS_KEY",
    "MAX_ANSWER_DEPTH",
    "OUTPUT_KEY",
    "VALIDATION_SECONDS",
    "Checked",
    "OutputSpec",
    "Rejected",
    "ValidationTooCostly",
    "parse_json_answer",
]

OUTPUT_KEY = "output"
GAPS_KEY = "gaps"
MAX_ERRORS = 8
"""Validation errors given back to the model (and kept): the first ones say enough."""
MAX_ERROR_CHARS = 300
"""Of one validation error, what is kept: a message quotes the value, which may be huge."""
MAX_ANSWER_DEPTH = MAX_VALUE_DEPTH
"""How deep an answer may nest (objects and arrays). A recursive schema is legitimate, and this
bounds it (keel/schema_checks.py). VALIDATION_SECONDS, how long one answer's validation may
take, is less when the run's deadline is nearer."""
_FENCE = re.compile(r"^```[a-zA-Z0-9_-]*\s*\n(.*?)\n?```\s*$", re.S)


@dataclass(frozen=True, slots=True)
class Checked:
    """An answer that validated: its JSON, and what a synthesis answer said it left open."""

    value: Any
    """The validated answer as JSON values (a model's `model_dump(mode="json")`)."""
    gaps: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Rejected:
    """An answer that did not validate: the errors, as text for the model and the failure."""

    errors: str


@dataclass(frozen=True, slots=True)
class OutputSpec:
    """The shape the run's answer must have."""

    name: str
    schema: dict[str, Any]
    model: type[pydantic.BaseModel] | None = None
    """The pydantic model it came from, which validates it; None: validated by JSON Schema."""

    @classmethod
    def of(cls, output_type: type[pydantic.BaseModel] | dict[str, Any]) -> OutputSpec:
        """From a pydantic model class or a JSON Schema (a dict); ConfigError for anything
        else, or for a schema that is not a valid JSON Schema."""
        if isinstance(output_type, type) and issubclass(output_type, pydantic.BaseModel):
            schema = output_type.model_json_schema()
            return cls(_wire_name(output_type.__name__), schema, output_type)
        if isinstance(output_type, dict):
            return cls.from_schema(output_type)
        raise ConfigError(
            "output_type must be a pydantic model class or a JSON Schema (a dict), "
            f"not {type(output_type).__name__}"
        )

    @classmethod
    def from_schema(cls, schema: dict[str, Any], name: str | None = None) -> OutputSpec:
        """A JSON Schema from outside: refused (ConfigError) unless it is valid and passes
        keel/schema_checks.py (a local $ref, no cycle, RE2 patterns, bounded nesting)."""
        checked_validator(schema, "the output schema")
        title = schema.get("title")
        return cls(_wire_name(name or (title if isinstance(title, str) else "answer")), schema)

    @classmethod
    def from_settings(cls, settings: dict[str, Any]) -> OutputSpec | None:
        """The spec a run was started with (saved in its settings), for a resumed run."""
        saved = settings.get("output_schema")
        if not isinstance(saved, dict) or not isinstance(saved.get("schema"), dict):
            return None
        return cls.from_schema(saved["schema"], str(saved.get("name") or "answer"))

    def settings(self) -> dict[str, Any]:
        """What is saved with the run, so a resume in any process asks for the same shape."""
        return {"output_schema": {"name": self.name, "schema": self.schema}}

    def request(self, synthesis: bool) -> OutputSchema:
        """What a request carries: the schema, or in a synthesis turn the envelope around it."""
        if not synthesis:
            return OutputSchema(self.name, self.schema)
        defs = self.schema.get("$defs")
        inner = {k: v for k, v in self.schema.items() if k != "$defs"}
        envelope: dict[str, Any] = {
            "type": "object",
            "properties": {
                OUTPUT_KEY: inner,
                GAPS_KEY: {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "What the answer could not establish: the open gaps.",
                },
            },
            "required": [OUTPUT_KEY, GAPS_KEY],
            "additionalProperties": False,
        }
        if isinstance(defs, dict):  # local references (#/$defs/...) keep resolving at the top
            envelope["$defs"] = defs
        return OutputSchema(f"{self.name}_partial", envelope, partial=True)

    def check(self, text: str | None, synthesis: bool) -> Checked | str:
        """The validated answer, or the errors (text for the model and the failure). A
        synthesis answer is read as the envelope, else as the bare schema (no gaps named)."""
        parsed = parse_json_answer(text)
        if isinstance(parsed, Rejected):
            return parsed.errors
        if not synthesis:
            return self._checked(parsed, ())
        if isinstance(parsed, dict) and OUTPUT_KEY in parsed:
            raw_gaps = parsed.get(GAPS_KEY) or []
            gaps = tuple(str(g) for g in raw_gaps) if isinstance(raw_gaps, list) else ()
            inside = self._checked(parsed[OUTPUT_KEY], gaps)
            if isinstance(inside, Checked):
                return inside
            bare = self._checked(parsed, ())  # the schema's own shape may hold "output"
            return bare if isinstance(bare, Checked) else inside
        bare = self._checked(parsed, ())
        if isinstance(bare, Checked):
            return bare  # the caller's shape without the envelope: partial, no gaps named
        return (
            f'the answer must be a JSON object with "{OUTPUT_KEY}" (matching the schema) and '
            f'"{GAPS_KEY}": {bare}'
        )

    async def check_bounded(
        self, text: str | None, synthesis: bool, seconds: float = VALIDATION_SECONDS
    ) -> Checked | str:
        """`check` in a thread of its own, so the event loop goes on meanwhile; one that takes
        longer than `seconds` raises ValidationTooCostly (the thread stops at its next keyword).
        A daemon thread: a process that is ending never waits for it."""
        return await off_loop(lambda: self.check(text, synthesis), seconds)

    def to_python(self, value: Any) -> Any:
        """The validated JSON as the caller's type: a model instance, or the JSON itself."""
        if self.model is None or value is None:
            return value
        return self.model.model_validate(value)

    def _checked(self, value: Any, gaps: tuple[str, ...]) -> Checked | str:
        """`value` validated (bounded in depth), or the errors as one text."""
        if value_depth(value, MAX_ANSWER_DEPTH) > MAX_ANSWER_DEPTH:
            return (
                f"the answer is nested more than {MAX_ANSWER_DEPTH} levels deep (arrays and "
                "objects); reply with a flatter JSON value that matches the schema"
            )
        try:
            valid = self._validate(value)
        except RecursionError:
            return "the answer is nested too deep for its schema; reply with a flatter value"
        return valid if isinstance(valid, str) else Checked(valid.value, gaps)

    def _validate(self, value: Any) -> _Valid | str:
        """The value as JSON (wrapped, to tell it from errors: a valid answer may itself be a
        string) when it validates, else the errors as one text."""
        if self.model is not None:
            try:
                dumped = self.model.model_validate(value).model_dump(mode="json")
            except pydantic.ValidationError as exc:
                lines = [
                    f"{'.'.join(str(p) for p in e['loc']) or '(top level)'}: {e['msg']}"
                    for e in exc.errors()[:MAX_ERRORS]
                ]
                return _joined(lines)
            return _Valid(dumped)
        errors = validation_errors(bounded_validator(self.schema), value)
        if not errors:
            return _Valid(value)
        return _joined(
            f"{'.'.join(str(p) for p in e.absolute_path) or '(top level)'}: {e.message}"
            for e in errors[:MAX_ERRORS]
        )


@dataclass(frozen=True, slots=True)
class _Valid:
    value: Any


def parse_json_answer(text: str | None) -> Any:
    """The JSON value an answer holds: the whole text, or inside a code fence, or from its
    first ``{`` to its last ``}``; Rejected when there is none (a JSON string is an answer)."""
    if text is None or not text.strip():
        return Rejected("the answer was empty; it must be a JSON value that matches the schema")
    body = text.strip()
    fenced = _FENCE.match(body)
    candidates = [fenced.group(1)] if fenced else []
    candidates.append(body)
    start, end = body.find("{"), body.rfind("}")
    if 0 <= start < end:
        candidates.append(body[start : end + 1])
    error = ""
    for candidate in candidates:
        try:
            return cast(Any, json.loads(candidate))
        except (json.JSONDecodeError, RecursionError) as exc:
            error = error or str(exc)
    return Rejected(f"the answer is not JSON ({error}); reply with only the JSON value")


def _joined(lines: Iterator[str] | list[str]) -> str:
    return "; ".join(
        line if len(line) <= MAX_ERROR_CHARS else line[:MAX_ERROR_CHARS] + "..." for line in lines
    )


def _wire_name(name: str) -> str:
    """A name every provider accepts for a schema or a tool: letters, digits, _ and -."""
    cleaned = re.sub(r"[^A-Za-z0-9_-]+", "_", name).strip("_")[:60]
    return cleaned or "answer"
