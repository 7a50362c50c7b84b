"""The agent options as command-line flags: typer parameters made from `keel.run_options` (a
renamed option's former flag too, hidden, ADR 0058), and the one function that turns a
command's options into its agent (ADR 0045).

`keel run`, `ask`, `serve` and `submit` each declare their own arguments and take the rest from
`with_agent_options`; each builds its agent with `command_agent`. No command calls another.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

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


def option_parameter(opt: Option, *, hidden: bool = False) -> inspect.Parameter:
    """`opt` as a typer option whose default is None, so `resolve` can tell a flag that was
    given from one that was not (and fall back to the environment and keel.toml). `hidden`:
    a former spelling (ADR 0058), accepted but not listed by `--help`."""
    flag = opt.flag_name
    if opt.kind == "bool" and "/" not in flag:
        flag = f"{flag}/--no-{flag.removeprefix('--')}"
    kind = _PYTHON_TYPES[opt.kind]
    annotation = Annotated[
        kind | None,  # type: ignore[valid-type]  # made at run time, read by typer
        typer.Option(flag, help=opt.help_text, show_default=False, hidden=hidden),
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
                option_parameter(former, hidden=True)
                for o in OPTIONS
                if o.name not in skip and (former := o.former) is not None
            ),
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
    from keel.assemble import agent_from_resolved
    from keel.cli.integrations import RunExtras, mcp_servers
    from keel.records import JsonValue
    from keel.run_options import resolve

    shown = {name: bool(options.pop(name, False)) for name in OUTPUT_PARAMETERS}
    resolved = guard(lambda: resolve(options))
    values = resolved.values
    servers = guard(
        lambda: mcp_servers(values["mcp"] or [], values["mcp_url"] or [], values["mcp_env"] or [])
    )
    mcp: list[JsonValue] = [s.to_json() for s in servers]
    if workers and mcp:
        usage_error(
            "keel submit: MCP servers are not started on workers, so this run would have no "
            "MCP tools there; run it here with keel run"
        )
    for warning in resolved.warnings:
        err.print(f"keel: {warning}", highlight=False, markup=False, soft_wrap=True)
    extras = RunExtras(shown["as_json"], shown["events"], shown["otel"], shown["otel_content"])
    extras.mcp_values = {s.name: {n: v for n, v in s.env_values if v is not None} for s in servers}
    agent = guard(lambda: agent_from_resolved(resolved, extras, mcp))
    note = free_model_note(agent, resolved)
    if note:
        err.print(f"keel: {note}", highlight=False, markup=False, soft_wrap=True)
    return CommandAgent(agent, extras, resolved, (values["repo"] or Path(".")).resolve())


def free_model_note(agent: Agent, resolved: Resolved) -> str | None:
    """A cost limit on a model that costs nothing (the embedded model, a script without a
    priced `model`) can never be reached: said in one line, not refused. A refusal would stop
    every run of such a model for a `max_cost` set in keel.toml or the environment for the
    paid models, and nothing is at risk: the run spends no money, and its other limits hold.
    A model with no known price is refused at start instead (the agent's check): its spending
    would go uncounted."""
    from keel.pricing import FREE, price_name

    limit = agent.limits.max_cost
    if limit is None or agent.price != FREE:
        return None
    model = price_name(agent.transport)
    return (
        f"the cost limit ({limit} from {resolved.sources['max_cost']}) has no effect: the model "
        f"{model} costs nothing, so the run is bounded by its other limits (model calls, "
        "tokens, the deadline)"
    )
