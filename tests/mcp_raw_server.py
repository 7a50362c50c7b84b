"""An MCP server nobody here wrote, as far as Keel can tell: JSON-RPC over stdio by hand, so it
can send what the `mcp` package's servers never would.

    python tests/mcp_raw_server.py deep-schema N     # `probe`'s input schema nests N levels
    python tests/mcp_raw_server.py call-error CODE   # every tools/call answers JSON-RPC CODE
    python tests/mcp_raw_server.py schema-file PATH  # `probe`'s input schema is PATH's JSON
    python tests/mcp_raw_server.py env-echo NAME     # `probe` answers the server's $NAME
    python tests/mcp_raw_server.py modern-only -     # refuses `initialize` (-32022), answers
                                                     # `server/discover` (MCP 2026-07-28 only)

It answers `initialize` with the version the client asked for, lists two tools (`probe`, and a
plain `echo`) and answers `ping`. The deep schema is written as text, level by level: no
encoder here would nest that deep.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

ECHO = {
    "name": "echo",
    "description": "Say the text back.",
    "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}},
    "annotations": {"readOnlyHint": True},
}

MODERN_RESULT = {"resultType": "complete", "ttlMs": 0, "cacheScope": "private"}


def deep_schema(levels: int) -> str:
    """`{"type": "object", "properties": {"a": {"type": "object", "properties": {"a": ...`."""
    head = '{"type": "object", "properties": {"a": ' * levels
    return head + '{"type": "string"}' + "}}" * levels


def tools_text(mode: str, value: str) -> str:
    if mode == "deep-schema":
        schema = deep_schema(int(value))
    elif mode == "schema-file":
        with open(value, encoding="utf-8") as file:
            schema = file.read()
    else:
        schema = '{"type": "object"}'
    probe = (
        '{"name": "probe", "description": "Probe the server.", "inputSchema": '
        + schema
        + ', "annotations": {"readOnlyHint": true}}'
    )
    return '{"tools": [' + probe + ", " + json.dumps(ECHO) + "]}"


def send(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def answer(ident: Any, result: str) -> None:
    send('{"jsonrpc": "2.0", "id": ' + json.dumps(ident) + ', "result": ' + result + "}")


def main() -> None:
    mode, value = sys.argv[1], sys.argv[2]
    for line in sys.stdin:
        if not line.strip():
            continue
        message = json.loads(line)
        method, ident = message.get("method"), message.get("id")
        tool = (message.get("params") or {}).get("name")
        if ident is None:  # a notification
            continue
        if method == "initialize" and mode == "modern-only":
            data = {"supported": ["2026-07-28"], "requested": message["params"]["protocolVersion"]}
            error = {"code": -32022, "message": "initialize is not accepted", "data": data}
            send(json.dumps({"jsonrpc": "2.0", "id": ident, "error": error}))
        elif method == "server/discover" and mode == "modern-only":
            found = {"supportedVersions": ["2026-07-28"], "capabilities": {"tools": {}}}
            answer(ident, json.dumps({**found, **MODERN_RESULT}))
        elif method == "initialize":
            version = message["params"].get("protocolVersion", "2025-06-18")
            info = {"name": "raw", "version": "1"}
            reply = {"protocolVersion": version, "capabilities": {"tools": {}}, "serverInfo": info}
            answer(ident, json.dumps(reply))
        elif method == "tools/list" and mode == "modern-only":  # results say how to cache them
            listed = json.loads(tools_text(mode, value))
            answer(ident, json.dumps({**listed, **MODERN_RESULT}))
        elif method == "tools/list":
            answer(ident, tools_text(mode, value))
        elif method == "tools/call" and mode == "call-error" and tool == "probe":
            error = {"code": int(value), "message": "the backend is overloaded; try again later"}
            send(json.dumps({"jsonrpc": "2.0", "id": ident, "error": error}))
        elif method == "tools/call" and mode == "env-echo" and tool == "probe":
            text = json.dumps(os.environ.get(value, "(unset)"))
            answer(ident, '{"content": [{"type": "text", "text": ' + text + "}]}")
        elif method == "tools/call":
            text = json.dumps(message["params"].get("arguments", {}).get("text", ""))
            answer(ident, '{"content": [{"type": "text", "text": ' + text + "}]}")
        elif method == "ping":
            answer(ident, "{}")
        else:
            error = {"code": -32601, "message": f"no method {method}"}
            send(json.dumps({"jsonrpc": "2.0", "id": ident, "error": error}))


if __name__ == "__main__":
    main()
