"""An agent built from a run's saved settings: the same tools for `keel run`, for `keel resume`
in another process, and for a worker that picks a run up on another machine.

It sits above the library (the agent, the tools, the transports) and below the command line and
the workers, which both build their agents here: neither imports the other (ADR 0045).
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

from keel._run import Listener
from keel.agent import DEFAULT_SYSTEM_PROMPT, Agent
from keel.config import config_files
from keel.durability import Durability
from keel.errors import ConfigError
from keel.hosted import hosted_tools_from
from keel.limits import Limits, current_names
from keel.live_file import wanted
from keel.models import resolve_model
from keel.pricing import configured_prices
from keel.records import JsonObject, JsonValue
from keel.store import RunRecord, RunStore
from keel.subagents import AS_AGENT
from keel.tools.base import BUILTIN_SOURCE, Tool
from keel.tools.files import file_tools
from keel.tools.web import web_tools
from keel.tools.writes import write_tools
from keel.transports.base import TOOL_CHOICES, Transport
from keel.transports.streaming import TextListener

if TYPE_CHECKING:
    from keel.run_options import Resolved

__all__ = [
    "SETTINGS",
    "Plugins",
    "agent_for_record",
    "agent_from_options",
    "agent_from_resolved",
    "build_agent",
    "settings_of",
]

SETTINGS = (
    "repo",
    "allow_hosts",
    "allow_writes",
    "search",
    "base_url",
    "base_url_redacted",
    "browser",
    "mcp",
    "without_tools",
    "tool_choice",
    "hosted_tools",
    "api_key_env",
    "first_turn_tool",
    "options",
    "agents",
)
"""What the command line saves with a run to rebuild its tools and transport anywhere (the
name of a key's variable, never the key)."""
PARENT_MODEL = "parent_model"
"""Saved with a child beside `as_agent`: the model it falls back to, and whose base URL it
may use (the parent's own model only)."""


class Plugins(Protocol):
    """What a caller plugs into the agent it builds: who hears the run, and the MCP servers
    it starts (stopped by `close`). The command line's `RunExtras` is one."""

    def listeners(self) -> tuple[Listener, ...]: ...

    def text_listeners(self) -> tuple[TextListener, ...]: ...

    def mcp_tools(self, settings: JsonObject) -> list[Tool]: ...

    @property
    def trace_content(self) -> bool: ...

    def close(self) -> None: ...


def build_agent(
    model: str,
    settings: JsonObject,
    limits: Limits,
    store: RunStore | str | Path,
    plugins: Plugins | None,
    system_prompt: str = DEFAULT_SYSTEM_PROMPT,
    approve_tools: Collection[str] = (),
    base_url: str | None = None,
    durability: Durability | None = None,
    output_type: dict[str, Any] | None = None,
) -> Agent:
    """`base_url`: the endpoint as the user gave it (with any credentials); `settings` hold
    only its public form, which is what gets stored. `plugins` None: quiet, and no MCP servers
    started (workers start none, ADR 0026)."""
    tools = _builtin(settings)
    base_url = base_url or _text(settings.get("base_url"))
    tools += _children(tools, settings, store, durability, (model, base_url))
    transport = _transport(model, base_url, settings)  # before any MCP server starts
    if plugins is not None:  # last: it starts servers, stopped by `plugins.close`
        tools += plugins.mcp_tools(settings)
    try:
        return Agent(
            transport or model,
            base_url=None if transport else base_url,
            tools=tools,
            limits=limits,
            system_prompt=system_prompt,
            store=store,
            listeners=plugins.listeners() if plugins else (),
            text_listeners=(*(plugins.text_listeners() if plugins else ()), *_live_files(store)),
            approve_tools=approve_tools,
            run_config={k: settings.get(k) for k in SETTINGS},
            trace_content=(plugins.trace_content if plugins else False) or None,
            durability=durability,
            prices=configured_prices([(f.path, f.data) for f in config_files()[0]]),
            output_type=output_type,
        )
    except BaseException:
        if plugins is not None:  # a bad model spec, a tool name clash: stop the servers
            plugins.close()
        raise


def agent_from_options(**options: Any) -> Agent:
    """An agent as `keel run` would build it from these options (keel/run_options.py: `model`,
    `repo`, `allow_writes`, `agent`, every limit, ...), each resolved as the command line
    resolves it: the argument, else its KEEL_ variable, else a trusted keel.toml, else its
    default. The built-in tools on `repo`; MCP servers are the command line's (give a program's
    own with `tools=keel.mcp_tools(...)` on an `Agent`)."""
    from keel.run_options import BY_NAME, FORMER_NAMES, resolve

    unknown = sorted(set(options) - set(BY_NAME) - set(FORMER_NAMES))
    if unknown:
        close = difflib.get_close_matches(unknown[0], list(BY_NAME), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"no run option {unknown[0]!r}{hint} (keel/run_options.py)")
    if options.get("mcp") or options.get("mcp_url"):
        raise ConfigError("agent_from_options starts no MCP servers: use keel.mcp_tools(...)")
    return agent_from_resolved(resolve(options), None, [])


def agent_from_resolved(resolved: Resolved, plugins: Plugins | None, mcp: list[JsonValue]) -> Agent:
    """The agent the resolved options describe; `mcp`: the MCP servers' saved form."""
    from keel.run_options import read_schema
    from keel.setting_checks import check_hosts
    from keel.store import store_target

    values = resolved.values
    folder = (values["repo"] or Path(".")).resolve()
    check_hosts(values["allow_host"] or [])
    schema_file: Path | None = values["output_schema"]
    return build_agent(
        values["model"],
        settings_of(resolved, folder, mcp),
        resolved.limits(),
        store_target(values["store"]),
        plugins,
        approve_tools=values["approve_tools"] or [],
        base_url=values["base_url"],
        durability=values["durability"],
        output_type=None if schema_file is None else read_schema(schema_file),
    )


def settings_of(resolved: Resolved, folder: Path, mcp: list[JsonValue]) -> JsonObject:
    """What is saved with the run to rebuild its tools and transport in any process."""
    from keel.config import public_url

    values = resolved.values
    settings: JsonObject = {
        "repo": str(folder),
        "allow_hosts": cast("list[JsonValue]", values["allow_host"] or []),
        "allow_writes": bool(values["allow_writes"]),
        "browser": bool(values["browser"]),
        "mcp": mcp,
        "first_turn_tool": "given" if resolved.given("first_turn_tool") else "default",
        "options": cast("JsonValue", resolved.saved()),
    }
    if values["agent"]:  # the tables as they are now, saved: a resume builds the same children
        from keel.run_options import agent_tables

        settings["agents"] = cast("JsonValue", agent_tables(values["agent"]))
    for key, name in (
        ("search", "search"),
        ("without_tools", "without_tool"),
        ("tool_choice", "tool_choice"),
        ("hosted_tools", "hosted_tool"),
        ("api_key_env", "api_key_env"),
    ):
        if values[name]:  # saved only when given: a run without them stores what it always did
            settings[key] = cast("JsonValue", values[name])
    if values["base_url"]:
        settings["base_url"] = public_url(values["base_url"])  # no credentials in the store
        settings["base_url_redacted"] = settings["base_url"] != values["base_url"]
    return settings


def agent_for_record(record: RunRecord, store: RunStore) -> Agent:
    """The agent a stored run was started with, rebuilt from its saved settings (quiet)."""
    config = record.config
    if AS_AGENT in config.settings:  # a child queued for the workers (ADR 0069)
        agent = _child_for_record(record, store)
    else:
        agent = build_agent(
            config.model,
            dict(config.settings),
            config.limits,
            store,
            None,
            config.system_prompt or DEFAULT_SYSTEM_PROMPT,
            config.approve_tools,
        )
    missing = set(config.tools) - {t.name for t in agent.tools}
    if missing:
        raise ConfigError(
            f"run {record.run_id} used tools the command line cannot rebuild "
            f"({', '.join(sorted(missing))}); resume it from your program with Agent.resume"
        )
    return agent


def _builtin(settings: JsonObject) -> list[Tool]:
    """The built-in tools the saved settings ask for, on their `repo`."""
    repo = Path(str(settings.get("repo", ".")))
    if not repo.is_dir():
        raise ConfigError(f"--repo {repo} is not a folder")
    allow_hosts = [str(h) for h in cast(list[str], settings.get("allow_hosts") or [])]
    tools: list[Tool] = [*file_tools(repo), *web_tools(allow_hosts=allow_hosts)]
    if settings.get("search"):
        from keel.tools.search_backends import backend_from_spec
        from keel.tools.web_search import search_tools

        spec = str(settings["search"])
        tools += search_tools(backend_from_spec(spec, allow_hosts=allow_hosts, repo=str(repo)))
    if settings.get("allow_writes"):
        tools += write_tools(repo)
    if settings.get("browser"):
        from keel.tools.browser import browser_tools

        tools += browser_tools(allow_hosts=allow_hosts)
    return _without(tools, cast(list[str], settings.get("without_tools") or []))


def _child_for_record(record: RunRecord, store: RunStore) -> Agent:
    """A child run a worker takes from the queue (ADR 0069), rebuilt from its own record: its
    parent's saved settings and the `[agents.NAME]` table it names, with its carved limits."""
    config = record.config
    settings = dict(config.settings)
    name = str(settings.pop(AS_AGENT))
    parent_model = str(settings.pop(PARENT_MODEL, None) or config.model)
    base_url = _text(settings.get("base_url"))
    tables = cast(dict[str, Any], settings.get("agents") or {})
    if name not in tables:
        raise ConfigError(f"run {record.run_id}: its saved settings have no [agents.{name}] table")
    agent = _child_agent(
        name, tables, _builtin(settings), settings, store, None, (parent_model, base_url), ()
    )
    agent.limits = config.limits
    return agent


def _child_agent(
    name: str,
    tables: dict[str, Any],
    builtin: list[Tool],
    settings: JsonObject,
    store: RunStore | str | Path,
    durability: Any,
    parent: tuple[str, str | None],
    above: tuple[str, ...],
) -> Agent:
    """The agent of table `name`: the parent's built-in tools or those it names, and the
    agents it names (`agents = [...]`: a deeper tree; none above it again). Its saved
    settings are the parent's and its table's name, so a worker can rebuild it alone."""
    table = cast(dict[str, Any], tables[name])
    offered = {t.name: t for t in builtin}
    wanted = table.get("tools")
    unknown = set(wanted or ()) - set(offered)
    if unknown:
        raise ConfigError(
            f"[agents.{name}] tools: no such tool here: {', '.join(sorted(unknown))} "
            f"(tools: {', '.join(offered)})"
        )
    spec = str(table.get("model") or parent[0])
    tools = [offered[t] for t in wanted] if wanted is not None else list(builtin)
    for below in table.get("agents") or ():
        if below in (*above, name) or below not in tables:
            raise ConfigError(
                f"[agents.{name}] agents: {below!r} is not an agent it may start (unknown, "
                "itself, or an agent above it)"
            )
        child = _child_agent(
            below, tables, builtin, settings, store, durability, (spec, parent[1]), (*above, name)
        )
        tools.append(child.as_tool(below, str(tables[below]["description"])))
    saved = {k: settings.get(k) for k in SETTINGS}
    return Agent(
        spec,
        base_url=parent[1] if spec == parent[0] else None,
        tools=tools,
        limits=Limits(**current_names(table.get("limits") or {})),
        system_prompt=str(table.get("instructions") or DEFAULT_SYSTEM_PROMPT),
        approve_tools=[str(t) for t in table.get("approve_tools") or ()],
        store=store,
        durability=durability,
        prices=configured_prices([(f.path, f.data) for f in config_files()[0]]),
        run_config={**saved, AS_AGENT: name, PARENT_MODEL: parent[0]},
    )


def _children(
    builtin: list[Tool],
    settings: JsonObject,
    store: RunStore | str | Path,
    durability: Any,
    parent: tuple[str, str | None],
) -> list[Tool]:
    """The sub-agents the run offers (`--agent NAME`, each an `[agents.NAME]` table saved with
    the run): each an agent with the parent's built-in tools, or those its table names, as a
    delegation tool (keel/subagents.py). Its runs live in the parent's store. Its model is its
    table's, else the parent's (`parent`: spec and base URL); the parent's base URL goes only
    with the parent's own model, so a child on another provider never gets it."""
    tables = settings.get("agents") or {}
    if not isinstance(tables, dict):
        raise ConfigError("the run's saved agents are not a table")
    made = []
    for name, saved in tables.items():
        if cast(dict[str, Any], saved).get("below"):  # another agent's sub-agent only
            continue
        child = _child_agent(name, tables, builtin, settings, store, durability, parent, ())
        made.append(child.as_tool(name, str(cast(dict[str, Any], saved)["description"])))
    return made


def _without(tools: list[Tool], names: list[str]) -> list[Tool]:
    """The built-in tools but those `--without-tool` names, each marked as built-in so that a
    clash with an MCP server's tool says which is which."""
    unknown = set(names) - {t.name for t in tools}
    if unknown:
        raise ConfigError(
            f"--without-tool {', '.join(sorted(unknown))}: no such built-in tool here "
            f"(built-in: {', '.join(t.name for t in tools)})"
        )
    return [dataclasses.replace(t, source=BUILTIN_SOURCE) for t in tools if t.name not in names]


def _transport(model: str, base_url: str | None, settings: JsonObject) -> Transport | None:
    """The transport when `--tool-choice`, `--api-key-env` or `--hosted-tool` shape it; None:
    the spec alone. The key is read from the named variable now and never saved."""
    choice, key_env = settings.get("tool_choice"), settings.get("api_key_env")
    hosted = hosted_tools_from(str(t) for t in cast(list[str], settings.get("hosted_tools") or []))
    if not (choice or key_env or hosted):
        return None
    if choice not in (None, *TOOL_CHOICES):
        raise ConfigError(f"--tool-choice must be one of {', '.join(TOOL_CHOICES)}, not {choice}")
    key = None
    if key_env:
        key = os.environ.get(str(key_env))
        if not key:
            raise ConfigError(f"--api-key-env {key_env}: that environment variable is not set")
    return resolve_model(
        model, base_url=base_url, api_key=key, tool_choice=choice, hosted_tools=hosted
    )


def _text(value: JsonValue) -> str | None:
    return None if value is None else str(value)


def _live_files(store: object) -> tuple[TextListener, ...]:
    """The UI's live text (keel/live_file.py), when `keel ui` asked for it on this store."""
    files = wanted(store)
    return () if files is None else (files,)
