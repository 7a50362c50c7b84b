"""`keel.mcp_tools(...)`: the public way to get an MCP server's tools.

The toolset needs the `mcp` package, which `import keel` never loads; this factory imports it
when called. It lives apart from the server specs (`mcp_servers`) so that the specs, the
session and the toolset import in one direction only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from keel.errors import ConfigError
from keel.tools.mcp_servers import McpServer

if TYPE_CHECKING:
    from keel.tools.mcp_tools import McpToolset

__all__ = ["mcp_tools"]


def mcp_tools(*servers: McpServer | str) -> McpToolset:
    """The tools of these MCP servers, once the toolset is entered (`with` or `async with`).

    A string is a server too: an http(s):// URL, or else a command started over stdio. Needs
    the `mcp` package (`pip install 'keel-runtime[mcp]'`); `import keel` alone never loads it.
    """
    specs = [s if isinstance(s, McpServer) else McpServer.parse(s) for s in servers]
    try:
        from keel.tools.mcp_tools import McpToolset
    except ImportError as exc:
        raise ConfigError(
            f"MCP servers need the mcp package ({exc}): pip install 'keel-runtime[mcp]'"
        ) from None
    return McpToolset(specs)
