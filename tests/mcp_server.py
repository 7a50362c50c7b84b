"""A small real MCP server for the tests, written with the `mcp` package's MCPServer.

    python tests/mcp_server.py --log CALLS.jsonl            # stdio
    python tests/mcp_server.py --log CALLS.jsonl --http     # streamable HTTP on loopback;
                                                            # prints "port N" once listening

Tools: `lookup` (read-only), `add_note` (side-effecting: appends to the notes file beside the
log), `explode` (always errors), `nap` (sleeps). Every call is appended to the log, one JSON
line each, before the tool does anything, so the tests can count what the server saw, across
processes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import time
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

GLOSSARY = {"lease": "A lease is held by one process at a time and expires if it dies."}


def build(log: Path, name: str = "glossary") -> MCPServer:
    server: MCPServer = MCPServer(name, log_level="WARNING")

    def seen(tool: str, **arguments: object) -> None:
        with log.open("a", encoding="utf-8") as out:
            out.write(json.dumps({"tool": tool, "arguments": arguments, "pid": os.getpid()}) + "\n")

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def lookup(term: str) -> str:
        """Look a term up in the glossary."""
        seen("lookup", term=term)
        return GLOSSARY.get(term, f"{term}: not in the glossary")

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False))
    async def add_note(text: str, linger: float = 0.0) -> str:
        """Append a note to the notes file."""
        seen("add_note", text=text, linger=linger)
        with (log.parent / "notes.txt").open("a", encoding="utf-8") as out:
            out.write(text + "\n")
        await asyncio.sleep(linger)
        return f"noted: {text}"

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def explode(reason: str) -> str:
        """Always fails."""
        seen("explode", reason=reason)
        raise ToolError(f"exploded: {reason}")

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def nap(seconds: float) -> str:
        """Sleep, then say so."""
        seen("nap", seconds=seconds)
        await asyncio.sleep(seconds)
        return f"slept {seconds}s"

    return server


def serve_http(server: MCPServer) -> None:
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)  # listening before it says so: an early connect queues, never refused
    port = sock.getsockname()[1]
    app = server.streamable_http_app()
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    print(f"port {port}", flush=True)
    uvicorn.Server(config).run(sockets=[sock])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--http", action="store_true")
    parser.add_argument("--name", default="glossary")
    parser.add_argument("--fail-start", action="store_true", help="exit before serving")
    args = parser.parse_args()
    if args.fail_start:
        print("this server refuses to start", file=sys.stderr)
        sys.exit(3)
    server = build(args.log, args.name)
    with args.log.open("a", encoding="utf-8") as out:
        out.write(json.dumps({"started": time.time(), "pid": os.getpid()}) + "\n")
    if args.http:
        serve_http(server)
    else:
        server.run("stdio")


if __name__ == "__main__":
    main()
