"""The command line's agent, built from a run's settings: the same tools for `keel run`, for
`keel resume` in another process, and for a worker that picks a run up on another machine."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import cast

from rich.console import Console

from keel.agent import DEFAULT_SYSTEM_PROMPT, Agent
from keel.cli.integrations import RunExtras
from keel.durability import Durability
from keel.errors import ConfigError
from keel.limits import Limits
from keel.present.progress import ProgressPrinter
from keel.records import JsonObject, JsonValue
from keel.store import RunRecord, RunStore
from keel.tools.base import Tool
from keel.tools.files import file_tools
from keel.tools.web import web_tools
from keel.tools.writes import write_tools

__all__ = ["agent_for_record", "command_agent"]

SETTINGS = (
    "repo", "allow_hosts", "allow_writes", "base_url", "base_url_redacted", "browser", "mcp"
)
"""What the command line saves with a run to rebuild its tools anywhere."""


def command_agent(
    model: str,
    settings: JsonObject,
    limits: Limits,
    store: RunStore | str | Path,
    extras: RunExtras | None,
    system_prompt: str = DEFAULT_SYSTEM_PROMPT,
    approve_tools: Collection[str] = (),
    base_url: str | None = None,
    durability: Durability | None = None,
) -> Agent:
    """`base_url`: the endpoint as the user gave it (with any credentials); `settings` hold
    only its public form, which is what gets stored. `extras` None: quiet, no MCP servers."""
    extras = extras or RunExtras(as_json=True, events=False, otel=False, otel_content=False)
    repo = Path(str(settings.get("repo", ".")))
    if not repo.is_dir():
        raise ConfigError(f"--repo {repo} is not a folder")
    allow_hosts = [str(h) for h in cast(list[str], settings.get("allow_hosts") or [])]
    tools: list[Tool] = [*file_tools(repo), *web_tools(allow_hosts=allow_hosts)]
    if settings.get("allow_writes"):
        tools += write_tools(repo)
    if settings.get("browser"):
        from keel.tools.browser import browser_tools

        tools += browser_tools(allow_hosts=allow_hosts)
    tools += extras.mcp_tools(settings)  # last: it starts servers, stopped by `extras`
    try:
        return Agent(
            model,
            base_url=base_url or _text(settings.get("base_url")),
            tools=tools,
            limits=limits,
            system_prompt=system_prompt,
            store=store,
            listeners=extras.listeners(lambda: ProgressPrinter(Console(stderr=True))),
            text_listeners=extras.text_listeners(),
            approve_tools=approve_tools,
            run_config={k: settings.get(k) for k in SETTINGS},
            trace_content=extras.otel_content or None,
            durability=durability,
        )
    except BaseException:
        extras.close()  # a bad model spec, a tool name clash: stop the servers just started
        raise


def agent_for_record(record: RunRecord, store: RunStore) -> Agent:
    """The agent a stored run was started with, rebuilt from its saved settings (quiet)."""
    config = record.config
    agent = command_agent(
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


def _text(value: JsonValue) -> str | None:
    return None if value is None else str(value)
