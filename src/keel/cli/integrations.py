"""What `keel run` and `keel resume` plug in: MCP servers, OpenTelemetry export, `--events`.

The command line keeps only its options; this module turns them into things the library
already has (`keel.mcp_tools`, a tracer provider, a listener), so a run started here behaves
like one started from a program.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from keel._run import Listener
from keel.cli.common import err
from keel.cli.output import Stdout
from keel.events import stream_lines
from keel.present.live_text import TerminalText
from keel.present.screen import Screen
from keel.records import JsonObject, JsonValue
from keel.result import RunResult
from keel.tools.base import Tool
from keel.tools.mcp import mcp_tools
from keel.tools.mcp_servers import (
    McpServer,
    servers_from_config,
    servers_from_flags,
    servers_from_settings,
    user_config_file,
)
from keel.trace_export import EXPORT_ENV, start_export
from keel.transports.streaming import TextListener

if TYPE_CHECKING:
    from keel.tools.mcp_tools import McpToolset

__all__ = ["EXPORT_ENV", "RunExtras", "mcp_servers", "mcp_settings", "open_mcp", "start_export"]



class RunExtras:
    """What `--mcp`/`--mcp-url`, `--events` and `--otel`/`--otel-content` add to one run of the
    command line. Used as a context manager around the run: leaving it stops the MCP servers it
    started and flushes the spans."""

    def __init__(self, as_json: bool, events: bool, otel: bool, otel_content: bool) -> None:
        self.as_json = as_json
        self.otel = otel or otel_content
        self.otel_content = otel_content
        self.out = Stdout()
        """stdout: the result, or the event lines; writes that fail are dropped, and noted."""
        self._lines = stream_lines(self.out) if events else None
        self.screen = Screen(err, self.out.write)
        """The terminal the answer, the progress lines and the spinner share (stdout, stderr)."""
        self.live: TerminalText | None = None
        """`keel run` on a terminal, without --json or --events: the answer as it is written."""
        if not as_json and not events and sys.stdout is not None and sys.stdout.isatty():
            self.live = TerminalText(self.screen)
        self._mcp: McpToolset | None = None
        self.mcp_values: dict[str, dict[str, str]] = {}
        """The values of the variables this run's MCP servers set, by server name: given here
        (`--mcp-env`, `[[mcp]]` env), never saved with the run."""
        self._stop_export: Callable[[], None] | None = None

    @property
    def quiet(self) -> bool:
        """Nothing but the JSON (or the event lines) goes to the terminal."""
        return self.as_json or self._lines is not None

    def listeners(self) -> tuple[Listener, ...]:
        """`--events` lines, or else progress lines unless `--json`."""
        if self._lines is not None:
            return (self._lines[0],)
        if self.as_json:
            return ()
        from keel.present.progress import ProgressPrinter

        return (ProgressPrinter(self.screen),)

    @property
    def trace_content(self) -> bool:
        """`--otel-content`: prompts, answers and tool I/O go in the spans."""
        return self.otel_content

    def text_listeners(self) -> tuple[TextListener, ...]:
        """Who hears the model's text as it is written: `--events` lines, or the terminal."""
        if self._lines is not None:
            return (self._lines[0],)
        return () if self.live is None else (self.live,)

    def answer_shown(self, answer: str) -> bool:
        """The answer already stands on the terminal, streamed as it was written."""
        return self.live is not None and self.live.shown(answer)

    def mcp_tools(self, settings: JsonObject) -> list[Tool]:
        self.close()
        self._mcp = open_mcp(settings, self.mcp_values)
        return self._mcp.tools if self._mcp is not None else []

    def start_export(self) -> None:
        self._stop_export = start_export(self.otel)

    def wrote(self, result: RunResult) -> bool:
        """With `--events`: write the result as the last line, and say it was written."""
        if self._lines is None:
            return False
        self._lines[1](result)
        return True

    def close(self) -> None:
        mcp, self._mcp = self._mcp, None
        if mcp is not None:
            mcp.close()

    def __enter__(self) -> RunExtras:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
        stop, self._stop_export = self._stop_export, None
        if stop is not None:
            stop()


def mcp_settings(commands: Sequence[str], urls: Sequence[str]) -> list[JsonValue]:
    """The servers a new run uses, as saved with it: the user's `[[mcp]]` tables, then flags."""
    return [s.to_json() for s in mcp_servers(commands, urls)]


def mcp_servers(
    commands: Sequence[str], urls: Sequence[str], env: Sequence[str] = ()
) -> list[McpServer]:
    """The servers a new run uses: the user's `[[mcp]]` tables, then the flags (`env`: the
    `--mcp-env NAME=VALUE` flags)."""
    servers: list[McpServer] = [*servers_from_config(), *servers_from_flags(commands, urls, env)]
    local = os.path.abspath("keel.toml")
    if os.path.isfile(local) and local != str(user_config_file()) and _has_mcp_tables(local):
        print(
            f"keel: ignoring [[mcp]] in {local}: MCP servers come from --mcp/--mcp-url or "
            f"{user_config_file()}, never from the working directory",
            file=sys.stderr,
        )
    return servers


def _has_mcp_tables(path: str) -> bool:
    try:
        with open(path, encoding="utf-8") as handle:
            return any(line.strip().replace(" ", "") == "[[mcp]]" for line in handle)
    except (OSError, UnicodeDecodeError):
        return False


def open_mcp(
    settings: JsonObject, values: Mapping[str, Mapping[str, str]] | None = None
) -> McpToolset | None:
    """Start or reach the run's MCP servers and list their tools; None when it has none.
    A server that cannot be used is a ConfigError (exit code 2). `values`: the values of the
    variables the servers set, by server name, when this process was given them."""
    servers = servers_from_settings(settings, values=values)
    if not servers:
        return None
    for server in servers:
        if server.command:
            server.start_env()  # a value that cannot be found again: refused before starting
    return mcp_tools(*servers).open()
