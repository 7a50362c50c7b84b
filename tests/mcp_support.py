"""Helpers for the MCP tests: the test server (`mcp_server.py`) over stdio or streamable HTTP,
and what it saw."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import keel

SERVER = Path(__file__).resolve().parent / "mcp_server.py"


def stdio_command(log: Path, *extra: str) -> list[str]:
    return [sys.executable, str(SERVER), "--log", str(log), *extra]


def stdio_server(log: Path, *extra: str, **options: Any) -> keel.McpServer:
    return keel.McpServer.stdio(stdio_command(log, *extra), **options)


def calls(log: Path, tool: str | None = None) -> list[dict[str, Any]]:
    """Every tool call the server(s) writing `log` saw, oldest first."""
    if not log.exists():
        return []
    seen = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return [s for s in seen if "tool" in s and (tool is None or s["tool"] == tool)]


def server_pids(log: Path) -> list[int]:
    if not log.exists():
        return []
    seen = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return [s["pid"] for s in seen if "started" in s]


@contextmanager
def http_server(log: Path, *extra: str) -> Iterator[str]:
    """The test server on loopback over streamable HTTP; yields its URL, stops it after."""
    proc = subprocess.Popen(
        [*stdio_command(log, *extra), "--http"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("port "), f"the HTTP server did not start: {line!r}"
        yield f"http://127.0.0.1:{int(line.split()[1])}/mcp"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def kill(pid: int) -> None:
    with suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}
