"""Connections to MCP servers, kept on an event loop of their own.

An MCP client (the `mcp` package, on anyio) belongs to the task that opened it, and Keel's
callers come and go with their loops (`Agent.run` is one `asyncio.run` per run; the command line
lists a server's tools before any run starts). So the connections live on a loop on a daemon
thread, one task owning each, and every call is handed over: a tool call from any loop or thread
reaches the server, cancelling it (a tool timeout, a cancelled run) cancels it there too, and a
server that crashes takes down its own task only, never the run's.

A connection that was lost (the server exited, the HTTP session ended) is opened again by the
next call, which starts a stdio server anew. A call that was running when the connection was
lost is answered as lost: for a side-effecting tool that means "effect unknown" (see
`keel.tools.mcp_tools`). A JSON-RPC error -32000 is both a server's own error and the code the
`mcp` client gives a lost connection: the server is asked again (its tools), and a live one's
-32000 is that call's error. Nothing here waits without a bound: opening has `connect_timeout`,
calls have the tool's timeout, closing has `CLOSE_TIMEOUT`; and a message from the server that
the client cannot read (JSON nested past its parser's limit, say) ends the requests waiting at
once, saying so, rather than leaving them to their timeouts. The `mcp` package's own log lines are
one line each on stderr, never a traceback (ADR 0049).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import io
import logging
import os
import sys
from collections.abc import Awaitable
from typing import Any, TextIO, TypeVar

from mcp import Client, StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError
from mcp.types import CONNECTION_CLOSED, UNSUPPORTED_PROTOCOL_VERSION, CallToolResult
from mcp.types import Tool as RemoteTool

from keel.tools.mcp_servers import McpServer

__all__ = ["CLOSE_TIMEOUT", "Connection", "ConnectionLost", "Unavailable", "describe"]

CLOSE_TIMEOUT = 10.0
MAX_TOOL_PAGES = 100
"""A server whose tool listing never ends is cut off here rather than listed forever."""
HANDSHAKES = ("legacy", "auto")
"""How a connection opens: the `initialize` handshake, then (only when a modern-only server
refuses it) the `mcp` client's own negotiation, which probes `server/discover`."""
PING_TIMEOUT = 5.0
"""How long a server that answered -32000 has to answer again, to show it is still there."""
T = TypeVar("T")


class Unavailable(Exception):
    """The server could not be started or reached, or did not answer in time."""


class ConnectionLost(Exception):
    """The connection ended while a call was running: its effect is unknown."""


class Unreadable(Exception):
    """The server sent a message the client could not read while a request waited."""


class Connection:
    """One server. Every method but the constructor runs on the MCP loop."""

    def __init__(self, server: McpServer) -> None:
        quiet_library_log()
        self.server = server
        self.client: Client | None = None
        self.lost: str | None = None
        """Why the last connection ended, once it has."""
        self._owner: asyncio.Task[None] | None = None
        self._stop: asyncio.Event | None = None
        self._lock: asyncio.Lock | None = None
        self._waiting: set[asyncio.Future[str]] = set()
        """One future per request in flight, given the reason when a message is unreadable."""

    async def tools(self) -> list[RemoteTool]:
        """Open the connection and list the server's tools, every page."""
        client = await self.connect()
        try:
            async with asyncio.timeout(self.server.connect_timeout):
                listed = await self._guarded(client.list_tools())
                tools = list(listed.tools)
                for _ in range(MAX_TOOL_PAGES):
                    if not listed.next_cursor:
                        break
                    listed = await self._guarded(client.list_tools(cursor=listed.next_cursor))
                    tools += listed.tools
        except TimeoutError:
            raise Unavailable(
                f"did not list its tools within {self.server.connect_timeout:g}s"
            ) from None
        except Exception as exc:
            raise Unavailable(f"could not list its tools: {describe(exc)}") from None
        return tools

    async def call(self, name: str, arguments: dict[str, Any]) -> CallToolResult:
        client = await self.connect()
        try:
            return await self._guarded(client.call_tool(name, arguments))
        except MCPError as exc:
            if exc.code != CONNECTION_CLOSED or await self._answers(client):
                raise  # the server's own error: the call's error result
            self.lost = self.lost or "the connection closed (did the server exit?)"
            raise ConnectionLost(self.lost) from None

    async def _answers(self, client: Client) -> bool:
        """Whether the server still answers (a tools listing, which every server keeps, where
        `ping` is gone from the newer protocol): a -32000 it sent is its own error."""
        if self.lost is not None:
            return False
        try:
            async with asyncio.timeout(min(PING_TIMEOUT, self.server.connect_timeout)):
                await self._guarded(client.list_tools())
        except Exception:
            return False
        return True

    async def _guarded(self, request: Awaitable[T]) -> T:
        """`request`, unless the server sends a message the client cannot read first: then
        Unreadable, at once (the client drops such a message, and the request would wait for
        an answer that never comes)."""
        spoiled: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._waiting.add(spoiled)
        work = asyncio.ensure_future(request)
        try:
            await asyncio.wait((work, spoiled), return_when=asyncio.FIRST_COMPLETED)
            if work.done():
                return work.result()
            raise Unreadable(spoiled.result())
        finally:
            self._waiting.discard(spoiled)
            if not work.done():
                work.cancel()

    async def _heard(self, message: Any) -> None:
        """The client's `message_handler`: a message it could not read arrives as an
        exception, and fails every request waiting."""
        if not isinstance(message, Exception):
            return
        reason = f"the server sent a message that could not be read ({_unreadable(message)})"
        for waiting in list(self._waiting):
            if not waiting.done():
                waiting.set_result(reason)

    async def connect(self) -> Client:
        """The open connection, opening it (again) when there is none or it was lost."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self.client is not None and self.lost is None:
                return self.client
            await self.close()
            self.lost = None
            ready: asyncio.Future[Client] = asyncio.get_running_loop().create_future()
            self._stop = asyncio.Event()
            self._owner = asyncio.create_task(self._own(ready, self._stop))
            try:
                async with asyncio.timeout(self.server.connect_timeout):
                    return await asyncio.shield(ready)
            except TimeoutError:
                await self.close()
                if ready.done() and not ready.cancelled():
                    ready.exception()  # retrieved: the timeout is the error reported
                raise Unavailable(
                    f"did not answer within {self.server.connect_timeout:g}s"
                ) from None
            except Unavailable:
                await self.close()
                raise

    async def _own(self, ready: asyncio.Future[Client], stop: asyncio.Event) -> None:
        """The task that holds the connection open until asked to stop. It opens with the
        `initialize` handshake every MCP server answers: the `mcp` client's default first
        probes `server/discover`, which a server on the 1.x line does not know and answers with
        some 60 lines of errors on the terminal. Only a server that refuses the handshake
        (a modern-only one, -32022) is opened again with the probe."""
        try:
            for mode in HANDSHAKES:
                try:
                    await self._hold(mode, ready, stop)
                    return
                except BaseException as exc:
                    if ready.done() or not _refuses_handshake(exc):
                        raise
        except BaseException as exc:  # the server failed: end this task, never the caller's
            reason = describe(exc)
            if not ready.done():
                ready.set_exception(Unavailable(reason))
            self.lost = self.lost or reason
            if not isinstance(exc, Exception):
                raise
        finally:
            self.client = None

    async def _hold(self, mode: str, ready: asyncio.Future[Client], stop: asyncio.Event) -> None:
        target = self._target()
        async with Client(target, cache=None, message_handler=self._heard, mode=mode) as client:
            self.client = client
            ready.set_result(client)
            await stop.wait()

    def _target(self) -> Any:
        """A URL, or the stdio transport (made here, so the server's stderr goes where Keel's
        does rather than wherever `sys.stderr` pointed when `mcp` was imported)."""
        server = self.server
        if server.url is not None:
            return server.url
        params = StdioServerParameters(
            command=server.command[0], args=list(server.command[1:]), env=server.start_env()
        )
        return stdio_client(params, errlog=server_log())

    async def close(self) -> None:
        """Stop the owner task: a stdio server is asked to exit, then killed."""
        owner, stop = self._owner, self._stop
        self._owner = self._stop = None
        if owner is None or stop is None:
            return
        stop.set()
        if self.client is None:  # still opening: nothing to wind down, stop it there
            owner.cancel()
        with contextlib.suppress(BaseException):
            async with asyncio.timeout(CLOSE_TIMEOUT):
                await owner
        if not owner.done():
            owner.cancel()


def _refuses_handshake(exc: BaseException) -> bool:
    """The server answered `initialize` with -32022: it serves the modern protocol only. The
    error may come wrapped in the transport's task groups."""
    if isinstance(exc, MCPError):
        return exc.code == UNSUPPORTED_PROTOCOL_VERSION
    if isinstance(exc, BaseExceptionGroup):
        return any(_refuses_handshake(inner) for inner in exc.exceptions)
    return False


def _unreadable(exc: Exception) -> str:
    """The parser's own words, short: pydantic's first error, else the exception's first line."""
    errors = getattr(exc, "errors", None)
    text = ""
    if callable(errors):
        try:
            first = errors()[0]
            text = str(first.get("msg", "")) if isinstance(first, dict) else ""
        except Exception:
            text = ""
    text = text or (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return text[:300]


class _OneLine(logging.Handler):
    """The `mcp` package's log lines, one line each on the stderr of the moment, without their
    tracebacks: Keel says itself what failed."""

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):  # stderr gone: nothing to say it on
            sys.stderr.write(f"keel: mcp: {record.getMessage()}"[:500] + "\n")


def quiet_library_log() -> None:
    """Once per process: the `mcp` loggers write one line each (warnings and worse) instead
    of Python's last-resort handler printing a traceback."""
    log = logging.getLogger("mcp")
    if not any(isinstance(h, _OneLine) for h in log.handlers):
        log.addHandler(_OneLine(logging.WARNING))


def server_log() -> TextIO:
    """Where a stdio server's stderr goes: Keel's own stderr when it is a real file."""
    try:
        sys.stderr.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation):
        return _devnull()
    return sys.stderr


@functools.cache
def _devnull() -> TextIO:
    return open(os.devnull, "w")  # one for the process, shared by every server


def describe(exc: BaseException) -> str:
    """One line for a person: the innermost causes of an error, groups unwrapped."""
    leaves: list[BaseException] = []

    def walk(e: BaseException) -> None:
        if isinstance(e, BaseExceptionGroup):
            for inner in e.exceptions:
                walk(inner)
        else:
            leaves.append(e)

    walk(exc)
    parts = []
    for leaf in leaves[:3]:
        if isinstance(leaf, MCPError):
            text = leaf.message
            if leaf.code == CONNECTION_CLOSED and leaf.message in ("", "Connection closed"):
                text = "the connection closed before it answered (did the server exit?)"
        elif isinstance(leaf, FileNotFoundError):
            text = f"no such program ({leaf.filename or leaf})"
        elif isinstance(leaf, asyncio.CancelledError):
            text = "cancelled"
        else:
            text = str(leaf).strip() or type(leaf).__name__
        parts.append(text)
    return "; ".join(dict.fromkeys(parts)) or type(exc).__name__
