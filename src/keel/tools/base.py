"""Tools: a name, a description, an argument schema, an effect, an approval policy, a timeout.

Definitions come from type-annotated functions (or a pydantic model as the one parameter), so the
schema the model sees and the validation Keel applies are the same pydantic model.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import typing
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, overload

import pydantic

from keel.errors import ConfigError, ToolError
from keel.messages import ToolCall, ToolDefinition
from keel.schema_checks import VALIDATION_SECONDS, ValidationTooCostly, off_loop
from keel.tools.threads import run_in_daemon_thread

__all__ = [
    "BUILTIN_SOURCE",
    "CURRENT_CALL",
    "MCP_SOURCE",
    "ApprovalPolicy",
    "Effect",
    "Tool",
    "ToolArgumentError",
    "make_tool",
    "render_result",
    "tool",
]

MCP_SOURCE = "MCP server"
"""How the `source` of a tool from an MCP server begins (``MCP server 'NAME'``)."""
BUILTIN_SOURCE = "Keel's built-in tools"
"""The `source` the command line gives the built-in tools it offers (`--without-tool` leaves
one out)."""


class Effect(StrEnum):
    """What running a tool does to the world; decides concurrency, resets and resume."""

    READ_ONLY = "read_only"
    """Reads only; safe to run concurrently and to re-run after a crash."""
    SIDE_EFFECTING = "side_effecting"
    """Changes something; runs one at a time, in order, and is never re-run automatically."""
    OBSERVATION = "observation"
    """Reads something that may change (a page being polled); a changed result is progress."""


ApprovalPolicy = bool | Callable[[dict[str, Any]], bool]

CURRENT_CALL: ContextVar[ToolCall | None] = ContextVar("keel_tool_call", default=None)
"""The call a tool is running for, with Keel's call id (set by the executor in the tool's own
task): a delegation tool names its child run after it (keel/subagents.py)."""


class ToolArgumentError(ToolError):
    """Arguments the model sent do not fit the schema; the message is for the model."""


Shortener = Callable[[dict[str, Any], str, int], "str | None"]
"""(the call's arguments, the whole result, the most characters to show) -> the part to show,
ending with the call that reads on, or None to let the executor cut the result plainly."""


@dataclass(frozen=True, slots=True, eq=False)
class Tool:
    name: str
    description: str
    args_model: type[pydantic.BaseModel]
    fn: Callable[..., Any]
    effect: Effect = Effect.READ_ONLY
    requires_approval: ApprovalPolicy = False
    timeout: float = 30.0
    """Seconds one call may take; the run's deadline shortens it further."""
    pass_model: bool = False
    """Call `fn` with the validated model itself rather than its fields as keywords."""
    parameters: dict[str, Any] = dataclasses.field(default_factory=dict)
    """JSON Schema of the arguments, derived once from `args_model`."""
    shorten: Shortener | None = None
    """Cuts a result longer than the run's result cap where the model can read on, and says
    which call reads the next part (`read_file` does); None: the executor's plain cut."""
    delegates: bool = False
    """Each call starts a child run (keel/subagents.py): the run shares what it has left
    among the batch's delegations."""
    source: str = ""
    """Where the tool comes from, for messages (``MCP server 'uvx mcp-server-fetch'``,
    ``Keel's built-in tools``: `MCP_SOURCE`, `BUILTIN_SOURCE`); empty for a tool given in
    code."""
    bounded_check: bool = False
    """Its arguments are checked against a schema from outside (an MCP server's): the executor
    checks them in a thread of their own, cut off at VALIDATION_SECONDS (`checked`)."""

    def __post_init__(self) -> None:
        if not self.parameters:
            schema = self.args_model.model_json_schema()
            schema.pop("title", None)
            object.__setattr__(self, "parameters", schema)

    def definition(self) -> ToolDefinition:
        return ToolDefinition(self.name, self.description, self.parameters)

    @property
    def runs_in_thread(self) -> bool:
        """Plain functions run in a thread, which a timeout abandons but cannot stop."""
        return not inspect.iscoroutinefunction(self.fn)

    def needs_approval(self, arguments: dict[str, Any]) -> bool:
        """Whether a call with `arguments` must wait for a person's decision.

        A predicate policy sees the arguments only once they fit the schema, as the validated
        values the tool would get (defaults filled in, types coerced), so it cannot be dodged
        by sending ``"1000"`` for ``1000``. Arguments that fail the schema need no approval:
        the call is answered with the validation error and never runs.

        Raises `keel.errors.ToolError`, naming the tool and the predicate's error, when the
        predicate itself raises; the caller answers the call with that message.
        """
        policy = self.requires_approval
        if not callable(policy):
            return bool(policy)
        try:
            validated = self.validate(arguments)
        except ToolArgumentError:
            return False
        try:
            return bool(policy(validated.model_dump()))
        except Exception as exc:
            detail = str(exc).strip() or "(no message)"
            raise ToolError(
                f"the approval check of {self.name} failed: {type(exc).__name__}: {detail}"
            ) from exc

    def validate(self, arguments: Any) -> pydantic.BaseModel:
        if not isinstance(arguments, dict):
            raise ToolArgumentError(
                f"arguments for {self.name} must be a JSON object, got {type(arguments).__name__}"
            )
        try:
            return self.args_model.model_validate(arguments)
        except pydantic.ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or '(arguments)'}: {err['msg']}"
                for err in exc.errors()
            )
            raise ToolArgumentError(f"invalid arguments for {self.name}: {problems}") from None

    async def checked(self, arguments: Any) -> pydantic.BaseModel:
        """`validate`, off the event loop and bounded in time for a `bounded_check` tool."""
        if not self.bounded_check:
            return self.validate(arguments)
        try:
            return await off_loop(lambda: self.validate(arguments), VALIDATION_SECONDS)
        except ValidationTooCostly:
            raise ToolArgumentError(
                f"invalid arguments for {self.name}: checking them against its schema took "
                f"over {VALIDATION_SECONDS:g}s"
            ) from None

    async def invoke(self, validated: pydantic.BaseModel) -> str:
        """Run the tool. Plain functions run in a daemon thread so they never block the loop,
        and never keep the process alive if they hang (see `keel.tools.threads`)."""
        if self.pass_model:
            args: tuple[Any, ...] = (validated,)
            kwargs: dict[str, Any] = {}
        else:
            args, kwargs = (), {k: getattr(validated, k) for k in type(validated).model_fields}
        if inspect.iscoroutinefunction(self.fn):
            value = await self.fn(*args, **kwargs)
        else:
            work = functools.partial(self.fn, *args, **kwargs)
            value = await run_in_daemon_thread(work)
        return render_result(value)


def render_result(value: Any) -> str:
    """Tools may return anything; the model reads text."""
    if isinstance(value, str):
        return value
    if isinstance(value, pydantic.BaseModel):
        return value.model_dump_json()
    return json.dumps(value, ensure_ascii=False, default=str)


def _args_model_from_signature(fn: Callable[..., Any], name: str) -> type[pydantic.BaseModel]:
    hints = typing.get_type_hints(fn, include_extras=True)  # keeps Annotated[..., Field(...)]
    fields: dict[str, Any] = {}
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ConfigError(f"tool {name}: *args and **kwargs cannot be described to a model")
        if param.name not in hints:
            raise ConfigError(f"tool {name}: parameter {param.name!r} needs a type annotation")
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (hints[param.name], default)
    model: type[pydantic.BaseModel] = pydantic.create_model(
        f"{name}_arguments", __config__=pydantic.ConfigDict(extra="forbid"), **fields
    )
    return model


def _single_model_param(fn: Callable[..., Any]) -> type[pydantic.BaseModel] | None:
    params = list(inspect.signature(fn).parameters.values())
    if len(params) != 1:
        return None
    hint = typing.get_type_hints(fn).get(params[0].name)
    if isinstance(hint, type) and issubclass(hint, pydantic.BaseModel):
        return hint
    return None


def make_tool(
    fn: Callable[..., Any],
    *,
    name: str | None = None,
    description: str | None = None,
    effect: Effect | str = Effect.READ_ONLY,
    requires_approval: ApprovalPolicy = False,
    timeout: float = 30.0,
) -> Tool:
    """Build a Tool from a function; see `tool` for the decorator form."""
    tool_name = name or fn.__name__
    doc = inspect.getdoc(fn) or ""
    text = description if description is not None else doc.split("\n\n")[0].strip()
    if not text:
        raise ConfigError(f"tool {tool_name}: give it a docstring or a description")
    try:
        effect = Effect(effect)
    except ValueError:
        choices = ", ".join(e.value for e in Effect)
        raise ConfigError(f"tool {tool_name}: effect must be one of {choices}") from None
    if timeout <= 0:
        raise ConfigError(f"tool {tool_name}: timeout must be positive")
    model = _single_model_param(fn)
    return Tool(
        name=tool_name,
        description=text,
        args_model=model or _args_model_from_signature(fn, tool_name),
        fn=fn,
        effect=effect,
        requires_approval=requires_approval,
        timeout=timeout,
        pass_model=model is not None,
    )


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...
@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    effect: Effect | str = Effect.READ_ONLY,
    requires_approval: ApprovalPolicy = False,
    timeout: float = 30.0,
) -> Callable[[Callable[..., Any]], Tool]: ...
def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    effect: Effect | str = Effect.READ_ONLY,
    requires_approval: ApprovalPolicy = False,
    timeout: float = 30.0,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Turn a type-annotated function into a Tool: ``@keel.tool(effect="observation")``."""

    def wrap(f: Callable[..., Any]) -> Tool:
        return make_tool(
            f,
            name=name,
            description=description,
            effect=effect,
            requires_approval=requires_approval,
            timeout=timeout,
        )

    return wrap(fn) if fn is not None else wrap
