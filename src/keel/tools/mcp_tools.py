"""MCP servers' tools as Keel tools: what `keel.mcp_tools(...)` opens.

    async with keel.mcp_tools("python server.py", "http://127.0.0.1:8000/mcp") as mcp:
        agent = keel.Agent(model, tools=[*mcp, *keel.file_tools(".")])

Each tool keeps its server's name, description and JSON Schema; arguments are checked against
the schema before the call, so a bad call is answered like any other tool's. The schema is the
server's, so it goes through Keel's one bounded path for schemas from outside
(keel/schema_checks.py, ADR 0062): checked when the tools are listed (a `$ref` only inside the
schema, so nothing is ever fetched or read; no cycle; RE2 patterns; bounded nesting), a tool
whose schema fails it refused there, naming it; and arguments validated with RE2 and a clock,
at most 64 levels deep, in a thread of their own (`Tool.bounded_check`). The effect comes
from the tool's annotations: `readOnlyHint` true is read_only; anything else is side_effecting,
which asks a person's approval unless pre-approved (the server's `approve` list, or the run's
`--approve-tools`), is journaled before it runs, and after a crash is answered "effect unknown"
rather than run again. A name offered by two servers (or by a server and another tool) is
refused, naming both; a server's `prefix` tells them apart (ADR 0022).

A server that cannot be started or reached is a `ConfigError` when the toolset opens. Later, a
call whose server has died, errors or times out is answered with an error result, and the run
goes on; the next call opens the connection again.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from collections.abc import Iterator, Sequence
from types import TracebackType
from typing import Any

import pydantic
from mcp.types import CallToolResult, EmbeddedResource, ImageContent, ResourceLink, TextContent
from mcp.types import Tool as RemoteTool

from keel.errors import ConfigError, EffectUnknown, ToolError
from keel.failpoints import failpoint
from keel.schema_checks import (
    MAX_VALUE_DEPTH,
    ValidationTooCostly,
    checked_validator,
    validation_errors,
    value_depth,
)
from keel.tools.base import MCP_SOURCE, Effect, Tool
from keel.tools.loop_thread import LoopThread
from keel.tools.mcp_servers import McpServer
from keel.tools.mcp_session import (
    CLOSE_TIMEOUT,
    Connection,
    ConnectionLost,
    Unavailable,
    describe,
)

__all__ = ["McpToolset", "result_text"]


class McpToolset:
    """Open connections to some MCP servers, and their tools as Keel `Tool`s.

    Enter it (`with`, `async with`, or `open()`) before use and leave it (or `close()`) when
    the runs that use it are done: leaving stops the stdio servers it started.
    """

    def __init__(self, servers: Sequence[McpServer]) -> None:
        names = [s.name for s in servers]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ConfigError(f"two MCP servers are named {twice[0]!r}; give each its own name")
        self.servers = tuple(servers)
        self._loop = LoopThread("keel-mcp", CLOSE_TIMEOUT)
        self._connections = [Connection(s) for s in servers]
        self._tools: list[Tool] | None = None

    @property
    def tools(self) -> list[Tool]:
        if self._tools is None:
            raise ConfigError("open the MCP toolset first (`with keel.mcp_tools(...) as mcp:`)")
        return list(self._tools)

    def __iter__(self) -> Iterator[Tool]:
        return iter(self.tools)

    def __len__(self) -> int:
        return len(self.tools)

    # -- opening and closing -------------------------------------------------------------------

    def open(self) -> McpToolset:
        """Start or reach every server and list its tools; raises ConfigError on failure."""
        if self._tools is None:
            limit = 2 * sum(s.connect_timeout for s in self.servers) + CLOSE_TIMEOUT
            try:
                self._tools = self._loop.run_blocking(self._list_all(), limit)
            except TimeoutError:
                self.close()
                raise ConfigError(f"the MCP servers did not answer within {limit:g}s") from None
            except BaseException:
                self.close()
                raise
        return self

    async def aopen(self) -> McpToolset:
        if self._tools is None:
            try:
                self._tools = await self._loop.run(self._list_all())
            except BaseException:
                await self.aclose()
                raise
        return self

    def close(self) -> None:
        """Stop the servers this toolset started and its loop; safe to call twice."""
        with contextlib.suppress(Exception):  # a server that will not stop is abandoned
            self._loop.run_blocking(self._close_all(), CLOSE_TIMEOUT * 2)
        self._loop.stop()

    async def aclose(self) -> None:
        with contextlib.suppress(Exception):  # a server that will not stop is abandoned
            await self._loop.run(self._close_all())
        await asyncio.to_thread(self._loop.stop)

    def __enter__(self) -> McpToolset:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> McpToolset:
        return await self.aopen()

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    # -- on the MCP loop -------------------------------------------------------------------------

    async def _list_all(self) -> list[Tool]:
        tools: list[Tool] = []
        offered: dict[str, str] = {}
        for connection in self._connections:
            server = connection.server
            try:
                remote = await connection.tools()
            except Unavailable as exc:
                raise ConfigError(f"MCP server {server.name!r} could not be used: {exc}") from None
            unknown = set(server.approve) - {t.name for t in remote}
            if unknown:
                raise ConfigError(
                    f"MCP server {server.name!r} has no tool named "
                    f"{', '.join(sorted(unknown))} (its approve list names it)"
                )
            for item in remote:
                tool = _keel_tool(server, item, functools.partial(self._call, connection))
                if tool.name in offered:
                    raise ConfigError(
                        f"the tool name {tool.name!r} is offered by two MCP servers, "
                        f"{offered[tool.name]!r} and {server.name!r}; give one of them a prefix "
                        '(keel run --mcp "prefix=NAME_:CMD", prefix = "..." in its [[mcp]] '
                        "table, or McpServer(prefix=...))"
                    )
                offered[tool.name] = server.name
                tools.append(tool)
        return tools

    async def _close_all(self) -> None:
        for connection in self._connections:
            await connection.close()

    async def _call(
        self, connection: Connection, name: str, arguments: dict[str, Any]
    ) -> CallToolResult:
        return await self._loop.run(connection.call(name, arguments))


def _keel_tool(server: McpServer, remote: RemoteTool, call: Any) -> Tool:
    read_only = remote.annotations is not None and remote.annotations.read_only_hint is True
    effect = Effect.READ_ONLY if read_only else Effect.SIDE_EFFECTING
    schema = dict(remote.input_schema or {})
    schema.setdefault("type", "object")
    schema.setdefault("properties", {})
    what = f"MCP server {server.name!r}, tool {remote.name!r}: the input schema"
    validator = checked_validator(schema, what)
    name = server.prefix + remote.name

    async def run(arguments: pydantic.BaseModel) -> str:
        return await _invoke(server, remote.name, effect, call, arguments.model_dump())

    return Tool(
        name=name,
        description=remote.description
        or remote.title
        or f"{remote.name} (MCP server {server.name})",
        args_model=_schema_model(name, validator),
        fn=run,
        effect=effect,
        requires_approval=not read_only and remote.name not in server.approve,
        timeout=server.timeout,
        pass_model=True,
        parameters=schema,
        source=f"{MCP_SOURCE} {server.name!r}",
        bounded_check=True,
    )


async def _invoke(
    server: McpServer, name: str, effect: Effect, call: Any, arguments: dict[str, Any]
) -> str:
    """One call; every way it can fail becomes a ToolError the model reads."""
    side_effect = effect is Effect.SIDE_EFFECTING
    if side_effect:
        failpoint("before_side_effect")
    try:
        result: CallToolResult = await call(name, arguments)
    except ConnectionLost as exc:
        where = f"MCP server {server.name!r} lost its connection while {name} was running ({exc})"
        if side_effect:
            raise EffectUnknown(
                f"Effect unknown: {where}. It may or may not have taken effect. Check its "
                "effect before relying on it, and do not repeat it blindly."
            ) from None
        raise ToolError(f"Error: {where}. Try again, or go on without it.") from None
    except Unavailable as exc:
        raise ToolError(
            f"Error: {name} was not run: MCP server {server.name!r} could not be reached ({exc})."
        ) from None
    except Exception as exc:
        raise ToolError(
            f"Error: {name} failed at MCP server {server.name!r}: {describe(exc)}"
        ) from None
    if side_effect:
        failpoint("inside_side_effect")
    text = result_text(result)
    if result.is_error:
        raise ToolError(
            f"Error: {name} (MCP server {server.name!r}) failed: {text or '(no message)'}"
        )
    return text


def result_text(result: CallToolResult) -> str:
    """What the model reads: the text blocks; other blocks named, their bytes left out."""
    parts: list[str] = []
    for block in result.content:
        if isinstance(block, TextContent):
            parts.append(block.text)
        elif isinstance(block, ImageContent):
            parts.append(f"[an image ({block.mime_type}) was returned; images are not shown]")
        elif isinstance(block, ResourceLink):
            parts.append(f"[resource: {block.uri}]")
        elif isinstance(block, EmbeddedResource):
            text = getattr(block.resource, "text", None)
            parts.append(text if isinstance(text, str) else f"[resource: {block.resource.uri}]")
        else:
            parts.append(f"[{getattr(block, 'type', 'unknown')} content is not shown]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False, default=str))
    return "\n".join(parts)


def _schema_model(name: str, validator: Any) -> type[pydantic.BaseModel]:
    """A model that accepts exactly what the tool's JSON Schema accepts, and keeps it whole;
    validated by the bounded validator (RE2, the thread's clock, at most MAX_VALUE_DEPTH)."""

    def check(cls: type[pydantic.BaseModel], data: Any) -> Any:
        if value_depth(data, MAX_VALUE_DEPTH) > MAX_VALUE_DEPTH:
            raise ValueError(f"the arguments are nested more than {MAX_VALUE_DEPTH} levels deep")
        try:
            errors = validation_errors(validator, data)
        except ValidationTooCostly:
            raise ValueError("checking them against the schema took too long") from None
        if errors:
            raise ValueError(
                "; ".join(
                    f"{'.'.join(str(p) for p in e.path) or '(arguments)'}: {e.message}"
                    for e in errors[:5]
                )
            )
        return data

    model: type[pydantic.BaseModel] = pydantic.create_model(
        f"{name}_arguments",
        __config__=pydantic.ConfigDict(extra="allow"),
        __validators__={"check": pydantic.model_validator(mode="before")(check)},  # type: ignore[dict-item]
    )
    return model
