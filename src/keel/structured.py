"""Structured output: the answer in the shape the caller asked for, validated (ADR 0034).

    Agent(output_type=Report)             a pydantic model: the answer is a validated Report
    Agent(output_type={"type": ...})      a JSON Schema: the answer is validated JSON
    keel run --output-schema FILE         a JSON Schema file

Each request of the run carries the schema (`ModelRequest.output`), and each transport asks for
it in its provider's own form (OpenAI's json_schema formats, an answer tool for Anthropic, a
grammar for the local model, instructions for the XML fallback). Whatever the provider does,
the answer is validated here: by pydantic for a model, by the JSON Schema validator for a
schema. A normal turn whose answer does not validate gets the errors back and one more turn (at
most `Limits.output_retries`); a synthesis turn asks for an envelope around the same schema,
``{"output": <the schema>, "gaps": [...]}``, so a forced answer is still the caller's shape and
says what it could not fill in (`partial`). An answer that cannot be validated even then ends
the run InvalidOutput, with the model's text kept.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, cast

import pydantic

from keel.errors import ConfigError
from keel.messages import OutputSchema

__all__ = ["GAPS_KEY", "OUTPUT_KEY", "Checked", "OutputSpec", "parse_json_answer"]

OUTPUT_KEY = "output"
GAPS_KEY = "gaps"
MAX_ERRORS = 8
"""Validation errors given back to the model (and kept): the first ones say enough."""
_FENCE = re.compile(r"^```[a-zA-Z0-9_-]*\s*\n(.*?)\n?```\s*$", re.S)


@dataclass(frozen=True, slots=True)
class Checked:
    """An answer that validated: its JSON, and what a synthesis answer said it left open."""

    value: Any
    """The validated answer as JSON values (a model's `model_dump(mode="json")`)."""
    gaps: tuple[str, ...] = ()


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
        import jsonschema  # only runs with a JSON Schema output pay for importing it

        try:
            jsonschema.validators.validator_for(schema).check_schema(schema)
        except jsonschema.SchemaError as exc:
            raise ConfigError(
                f"the output schema is not a valid JSON Schema: {exc.message}"
            ) from None
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
        """The validated answer, or the errors (text for the model and the failure)."""
        parsed = parse_json_answer(text)
        if isinstance(parsed, str):
            return parsed
        gaps: tuple[str, ...] = ()
        if synthesis:
            if not isinstance(parsed, dict) or OUTPUT_KEY not in parsed:
                return f'the answer must be a JSON object with "{OUTPUT_KEY}" and "{GAPS_KEY}"'
            raw_gaps = parsed.get(GAPS_KEY) or []
            gaps = tuple(str(g) for g in raw_gaps) if isinstance(raw_gaps, list) else ()
            parsed = parsed[OUTPUT_KEY]
        problems = self._validate(parsed)
        if isinstance(problems, str):
            return problems
        return Checked(problems, gaps)

    def to_python(self, value: Any) -> Any:
        """The validated JSON as the caller's type: a model instance, or the JSON itself."""
        if self.model is None or value is None:
            return value
        return self.model.model_validate(value)

    def _validate(self, value: Any) -> Any:
        """The value as JSON when it validates, else the errors as one text."""
        if self.model is not None:
            try:
                return self.model.model_validate(value).model_dump(mode="json")
            except pydantic.ValidationError as exc:
                lines = [
                    f"{'.'.join(str(p) for p in e['loc']) or '(top level)'}: {e['msg']}"
                    for e in exc.errors()[:MAX_ERRORS]
                ]
                return "; ".join(lines)
        import jsonschema

        validator = jsonschema.validators.validator_for(self.schema)(self.schema)
        errors = sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))
        if not errors:
            return value
        lines = [
            f"{'.'.join(str(p) for p in e.absolute_path) or '(top level)'}: {e.message}"
            for e in errors[:MAX_ERRORS]
        ]
        return "; ".join(lines)


def parse_json_answer(text: str | None) -> Any:
    """The JSON value an answer holds: the whole text, or inside a code fence, or from its
    first ``{`` to its last ``}``; the error text when there is none."""
    if text is None or not text.strip():
        return "the answer was empty; it must be a JSON value that matches the schema"
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
    return f"the answer is not JSON ({error}); reply with only the JSON value"


def _wire_name(name: str) -> str:
    """A name every provider accepts for a schema or a tool: letters, digits, _ and -."""
    cleaned = re.sub(r"[^A-Za-z0-9_-]+", "_", name).strip("_")[:60]
    return cleaned or "answer"
