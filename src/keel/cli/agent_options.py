"""The agent options on the command line: typer parameters made from `keel.run_options`, and the
one function that turns a command's options into its agent (ADR 0045).

`keel run`, `ask`, `serve` and `submit` each declare their own arguments and take the rest from
`with_agent_options`; each builds its agent with `command_agent`. No command calls another.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer

from keel.cli.common import (
    EventsOption,
    JsonOption,
    OtelContentOption,
    OtelOption,
    err,
    guard,
    usage_error,
)
from keel.run_options import OPTIONS, Option

if TYPE_CHECKING:
    from keel.agent import Agent
    from keel.cli.integrations import RunExtras
    from keel.records import JsonObject, JsonValue
    from keel.run_options import Resolved

__all__ = ["CommandAgent", "command_agent", "with_agent_options"]

_PYTHON_TYPES: dict[str, Any] = {
    "str": str, "int": int, "float": float, "bool": bool, "path": Path, "list": list[str],
}  # fmt: skip
OUTPUT_PARAMETERS: dict[str, Any] = {
    "as_json": JsonOption,
    "events": EventsOption,
    "otel": OtelOption,
    "otel_content": OtelContentOption,
}
"""How a command's run is shown and traced: beside the agent's options, not part of them."""


def option_parameter(opt: Option) -> inspect.Parameter:
    """`opt` as a typer option whose default is None, so `resolve` can tell a flag that was
    given from one that was not (and fall back to the environment and keel.toml)."""
    flag = opt.flag_name
    if opt.kind == "bool" and "/" not in flag:
        flag = f"{flag}/--no-{flag.removeprefix('--')}"
    kind = _PYTHON_TYPES[opt.kind]
    annotation = Annotated[
        kind | None,  # type: ignore[valid-type]  # made at run time, read by typer
        typer.Option(flag, help=opt.help_text, show_default=False),
    ]
    return inspect.Parameter(
        opt.name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation
    )


def with_agent_options(
    *, skip: Sequence[str] = (), output: Sequence[str] = tuple(OUTPUT_PARAMETERS)
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Give a command (its own parameters first, then ``**options``) every agent option but
    those in `skip`, and the `output` parameters."""

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        own = [
            p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
            for p in inspect.signature(command, eval_str=True).parameters.values()
            if p.kind is not inspect.Parameter.VAR_KEYWORD
        ]
        keyword = inspect.Parameter.KEYWORD_ONLY
        params = [
            *own,
            *(option_parameter(o) for o in OPTIONS if o.name not in skip),
            *(
                inspect.Parameter(name, keyword, default=False, annotation=OUTPUT_PARAMETERS[name])
                for name in output
            ),
        ]
        command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command

    return decorate


@dataclass
class CommandAgent:
    """A command's agent, with what the command shows around its run."""

    agent: Agent
    extras: RunExtras
    resolved: Resolved
    folder: Path
    """The file tools' folder (`--repo`, else the current folder)."""


def command_agent(options: dict[str, Any], *, workers: bool = False) -> CommandAgent:
    """The agent a command's options describe: each option resolved once (flag > environment
    > keel.toml > default), misuse one line and exit code 2. `workers`: the run goes to
    `keel worker`s, which start no MCP servers (ADR 0026)."""
    from keel.assemble import build_agent
    from keel.cli.integrations import RunExtras, mcp_settings
    from keel.options import check_hosts
    from keel.run_options import read_schema, resolve
    from keel.store import store_target

    shown = {name: bool(options.pop(name, False)) for name in OUTPUT_PARAMETERS}
    resolved = guard(lambda: resolve(options))
    values = resolved.values
    folder = (values["repo"] or Path(".")).resolve()
    settings = guard(lambda: _settings(resolved, folder, mcp_settings))
    if workers and settings["mcp"]:
        usage_error(
            "keel submit: MCP servers are not started on workers, so this run would have no "
            "MCP tools there; run it here with keel run"
        )
    guard(lambda: check_hosts(values["allow_host"] or []))
    for warning in resolved.warnings:
        err.print(f"keel: {warning}", highlight=False, markup=False, soft_wrap=True)
    schema_file: Path | None = values["output_schema"]
    schema = None if schema_file is None else guard(lambda: read_schema(schema_file))
    extras = RunExtras(shown["as_json"], shown["events"], shown["otel"], shown["otel_content"])
    agent = guard(
        lambda: build_agent(
            values["model"],
            settings,
            resolved.limits(),
            store_target(values["store"]),
            extras,
            approve_tools=values["approve_tools"] or [],
            base_url=values["base_url"],
            durability=values["durability"],
            output_type=schema,
        )
    )
    return CommandAgent(agent, extras, resolved, folder)


def _settings(
    resolved: Resolved, folder: Path, mcp_settings: Callable[..., list[JsonValue]]
) -> JsonObject:
    """What is saved with the run to rebuild its tools and transport in any process."""
    from keel.config import public_url

    values = resolved.values
    settings: JsonObject = {
        "repo": str(folder),
        "allow_hosts": cast("list[JsonValue]", values["allow_host"] or []),
        "allow_writes": bool(values["allow_writes"]),
        "browser": bool(values["browser"]),
        "mcp": mcp_settings(values["mcp"] or [], values["mcp_url"] or []),
        "first_turn_tool": "given" if resolved.given("first_turn_tool") else "default",
        "options": cast("JsonValue", resolved.saved()),
    }
    if values["agent"]:  # the tables as they are now, saved: a resume builds the same children
        from keel.run_options import agent_tables

        settings["agents"] = cast("JsonValue", agent_tables(values["agent"]))
    for key, name in (
        ("without_tools", "without_tool"),
        ("tool_choice", "tool_choice"),
        ("api_key_env", "api_key_env"),
    ):
        if values[name]:  # saved only when given: a run without them stores what it always did
            settings[key] = cast("JsonValue", values[name])
    if values["base_url"]:
        settings["base_url"] = public_url(values["base_url"])  # no credentials in the store
        settings["base_url_redacted"] = settings["base_url"] != values["base_url"]
    return settings
