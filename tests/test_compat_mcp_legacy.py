"""Keel against an MCP server built on the `mcp` package's 1.x line (ADR 0065): the reference
`mcp-server-sqlite`, which needs ``mcp<2`` in an environment of its own (installed once per
machine, tests/side_installs.py). Keel's own `mcp` is 2.x, whose client by default probes
``server/discover`` first; a 1.x server does not know that method and wrote about 60 lines of
errors to the terminal before the handshake went on. Keel opens with the ``initialize``
handshake every MCP server answers, and turns to the probe only for a server that refuses it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from side_installs import private_venv

PACKAGES = ("mcp-server-sqlite==2025.4.25", "mcp<2")

LIST_TOOLS = """
import sys
import keel
from keel.tools.mcp_servers import McpServer

server = McpServer(name="sqlite", command=(sys.argv[1], "--db-path", sys.argv[2]))
with keel.mcp_tools(server) as tools:
    print(sorted(t.name for t in tools))
"""


@pytest.fixture(scope="session")
def sqlite_server(pytestconfig: pytest.Config) -> Path:
    python = private_venv(pytestconfig, "mcp-server-sqlite", PACKAGES)
    return python.parent / "mcp-server-sqlite"


def test_an_mcp_1x_server_lists_its_tools_and_writes_no_errors(
    sqlite_server: Path, tmp_path: Path
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", LIST_TOOLS, str(sqlite_server), str(tmp_path / "db.sqlite")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "read_query" in done.stdout and "list_tables" in done.stdout
    noise = [line for line in done.stderr.splitlines() if line.strip()]
    assert noise == [], f"{len(noise)} lines on stderr: {noise[:8]}"


RAW_SERVER = Path(__file__).resolve().parent / "mcp_raw_server.py"


def test_a_modern_only_server_that_refuses_the_handshake_is_opened_with_the_probe() -> None:
    """A server of the 2026-07-28 era alone answers `initialize` with -32022: Keel opens it
    again the `mcp` client's own way (`server/discover`), and its tools are called."""
    import keel
    from keel.tools.mcp_servers import McpServer

    server = McpServer(name="modern", command=(sys.executable, str(RAW_SERVER), "modern-only", "-"))
    with keel.mcp_tools(server) as tools:
        assert sorted(t.name for t in tools) == ["echo", "probe"]
