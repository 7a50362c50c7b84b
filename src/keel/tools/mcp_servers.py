"""Which MCP servers a run uses: `McpServer`, from the command line, `keel.toml` or code.

A server is started as a command speaking MCP over stdio, or reached at a streamable HTTP URL.
The spec is saved with the run (`McpServer.to_json`), so `keel resume` in another process
starts or reaches the same servers. It never holds a secret: a stdio server gets the few
variables the `mcp` package always passes (HOME, LOGNAME, PATH, SHELL, TERM, USER), the ones
its spec passes by name from Keel's environment (`env_pass`), and the ones it sets (`env =
{NAME = "value"}`, `--mcp-env NAME=VALUE`); only their names are saved, and a resume reads each
value again where it came from (`keel resume --mcp-env`, the `[[mcp]]` table, else Keel's
environment). A URL with a user or password in it is refused.

A value set over one of Keel's own variables (`--mcp-env OPENAI_API_KEY=dummy`, where Keel's
environment holds the real key) is marked so (`env_override`, a name, never a value): a resume
never reads that one from Keel's environment, which holds exactly what the user chose not to
pass; it must be given again (ADR 0062, MC-07).

`[[mcp]]` tables are read from the `keel.toml` in the user's config folder only, never from the
working directory's: a `keel.toml` that came with a repository being researched must not start
programs on this machine (ADR 0022).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import shlex
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import platformdirs

from keel.config import http_url
from keel.errors import ConfigError
from keel.records import JsonObject, JsonValue

__all__ = [
    "MAX_SECONDS",
    "McpServer",
    "resumed_values",
    "servers_from_config",
    "servers_from_flags",
    "servers_from_settings",
    "user_config_file",
]

_TABLE_KEYS = {
    "name", "command", "url", "approve", "prefix", "env", "env_pass", "env_set", "env_override",
    "timeout", "connect_timeout",
}  # fmt: skip
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_SECONDS = 86_400.0
"""The longest timeout a server may have: inf, or 1e12, would overflow the clock a wait uses."""


@dataclass(frozen=True, slots=True)
class McpServer:
    """One MCP server: a stdio `command` or a streamable HTTP `url` (exactly one)."""

    name: str
    """Names the server in messages and clash errors; defaults to its command or URL."""
    command: tuple[str, ...] = ()
    """The program and its arguments, started with MCP on its stdin/stdout."""
    url: str | None = None
    """A streamable HTTP endpoint, such as http://127.0.0.1:8000/mcp."""
    approve: tuple[str, ...] = ()
    """Side-effecting tools of this server (by the server's own names) that run without asking."""
    prefix: str = ""
    """Put before each of this server's tool names, to tell two servers' tools apart."""
    env: tuple[str, ...] = ()
    """Names of environment variables a stdio server gets from Keel's environment, beside
    the few the `mcp` package always passes (HOME, PATH, ...). Only the names are saved."""
    env_values: tuple[tuple[str, str | None], ...] = field(default=(), compare=False)
    """Variables set for a stdio server, NAME and value; only the names are saved, so a spec
    rebuilt from a run's settings holds None for a value not found again (read from Keel's
    environment when the server starts, see `start_env`)."""
    timeout: float = 30.0
    """Seconds one tool call may take (the run's deadline shortens it further)."""
    connect_timeout: float = 30.0
    """Seconds to start the server (or reach it) and list its tools."""
    env_override: tuple[str, ...] = field(default=(), compare=False)
    """Set variables whose value differed from Keel's own variable of that name when the run
    started: never read from Keel's environment on resume (see the module docstring)."""

    def __post_init__(self) -> None:
        if bool(self.command) == bool(self.url):
            raise ConfigError(f"MCP server {self.name!r}: give either a command or a url")
        if self.url is not None and (self.env or self.env_values):
            raise ConfigError(
                f"MCP server {self.name!r}: env and env_pass are for stdio servers (a command), "
                "not a url"
            )
        for name in (*self.env, *(n for n, _ in self.env_values)):
            if not _ENV_NAME.fullmatch(name):
                raise ConfigError(
                    f"MCP server {self.name!r}: {name!r} is not an environment variable name "
                    "(letters, digits and _, not starting with a digit)"
                )
        if self.url is not None:
            _check_url(self.url)
        for value, what in ((self.timeout, "timeout"), (self.connect_timeout, "connect_timeout")):
            if not (math.isfinite(value) and 0 < value <= MAX_SECONDS):  # a wait must fit a clock
                raise ConfigError(
                    f"MCP server {self.name!r}: {what} must be a finite, positive number of "
                    f"seconds, at most {MAX_SECONDS:g} (a day), not {value!r}"
                )

    @classmethod
    def stdio(
        cls,
        command: str | Sequence[str],
        *,
        name: str | None = None,
        approve: Sequence[str] = (),
        prefix: str = "",
        env: Sequence[str] | Mapping[str, str | None] = (),
        env_pass: Sequence[str] = (),
        timeout: float = 30.0,
        connect_timeout: float = 30.0,
    ) -> McpServer:
        """A server started as `command` (a shell-style string or an argument list). `env`: the
        variables to set, NAME to value (a list of names is passed as `env_pass` is);
        `env_pass`: names of variables passed from Keel's environment."""
        argv = tuple(shlex.split(command) if isinstance(command, str) else command)
        if not argv:
            raise ConfigError("an MCP server command must name a program")
        return cls(
            name=name or shlex.join(argv),
            command=argv,
            approve=tuple(approve),
            prefix=prefix,
            env=(*(() if isinstance(env, Mapping) else env), *env_pass),
            env_values=tuple(env.items()) if isinstance(env, Mapping) else (),
            timeout=timeout,
            connect_timeout=connect_timeout,
        )

    @classmethod
    def http(
        cls,
        url: str,
        *,
        name: str | None = None,
        approve: Sequence[str] = (),
        prefix: str = "",
        timeout: float = 30.0,
        connect_timeout: float = 30.0,
    ) -> McpServer:
        """A server reached over streamable HTTP at `url`."""
        return cls(
            name=name or url,
            url=url,
            approve=tuple(approve),
            prefix=prefix,
            timeout=timeout,
            connect_timeout=connect_timeout,
        )

    @classmethod
    def parse(cls, text: str) -> McpServer:
        """An http(s):// URL is a streamable HTTP server; anything else a stdio command."""
        if text.startswith(("http://", "https://")):
            return cls.http(text)
        return cls.stdio(text)

    def to_json(self) -> JsonObject:
        """What the run saves to rebuild this server on resume: no secret, only names."""
        data: JsonObject = {"name": self.name}
        if self.command:
            data["command"] = list(self.command)
        else:
            data["url"] = self.url
        data["approve"] = list(self.approve)
        data["prefix"] = self.prefix
        data["env"] = list(self.env)
        if self.env_values:  # names only: a value may be a secret
            data["env_set"] = [name for name, _ in self.env_values]
        overrides = self.overrides()
        if overrides:  # names only: which set values Keel's own environment must not stand in for
            data["env_override"] = list(overrides)
        data["timeout"] = self.timeout
        data["connect_timeout"] = self.connect_timeout
        return data

    def overrides(self) -> tuple[str, ...]:
        """The set variables whose value is not Keel's own of that name (marked before, or
        differing from Keel's environment now)."""
        now = {
            name
            for name, value in self.env_values
            if value is not None and name in os.environ and os.environ[name] != value
        }
        return tuple(sorted(now | set(self.env_override)))

    def start_env(self) -> dict[str, str]:
        """The variables this stdio server is started with, beside the `mcp` package's
        defaults: the passed names Keel's environment has, then the ones set. A set value the
        saved settings could not hold is read from Keel's environment (never one that was set
        over Keel's own), else a ConfigError."""
        env = {k: os.environ[k] for k in self.env if k in os.environ}
        for name, value in self.env_values:
            if value is None and name in self.env_override:
                raise ConfigError(
                    f"MCP server {self.name!r}: {name} was set for it to a value of its own, "
                    f"not Keel's {name}, when the run started; that value is not saved and "
                    f"Keel's own is not passed in its place: give it again with "
                    f"`keel resume RUN --mcp-env {name}=VALUE`, or in the server's [[mcp]] "
                    f"table in {user_config_file()}"
                )
            if value is None:
                value = os.environ.get(name)
            if value is None:
                raise ConfigError(
                    f"MCP server {self.name!r}: {name} was set for it when the run started "
                    "(--mcp-env or its [[mcp]] table's env), and its value is not saved (it may "
                    f"be a secret): start Keel with {name}=VALUE in its environment, or set it "
                    f"in the server's [[mcp]] table in {user_config_file()}"
                )
            env[name] = value
        return env

    def with_values(self, values: Mapping[str, str]) -> McpServer:
        """This spec with the set variables' values it lacks taken from `values`."""
        if not any(v is None and n in values for n, v in self.env_values):
            return self
        filled = tuple((n, values.get(n) if v is None else v) for n, v in self.env_values)
        return dataclasses.replace(self, env_values=filled)

    @classmethod
    def from_json(cls, data: Mapping[str, Any], where: str = "the run's settings") -> McpServer:
        """A spec from a `[[mcp]]` table or a saved run; unknown keys are an error."""
        unknown = set(data) - _TABLE_KEYS
        if unknown:
            raise ConfigError(
                f"{where}: unknown key(s) in an MCP server: {', '.join(sorted(unknown))} "
                f"(known: {', '.join(sorted(_TABLE_KEYS))})"
            )
        command, url = data.get("command"), data.get("url")
        common: dict[str, Any] = {
            "approve": _names(data.get("approve", ()), "approve", where),
            "prefix": _text(data.get("prefix", ""), "prefix", where),
            "timeout": _number(data.get("timeout", 30.0), "timeout", where),
            "connect_timeout": _number(data.get("connect_timeout", 30.0), "connect_timeout", where),
        }
        name = data.get("name")
        if name is not None:
            common["name"] = _text(name, "name", where)
        if command is not None and url is None:
            if not isinstance(command, str | list):
                raise ConfigError(f"{where}: an MCP command is a string or a list of strings")
            argv = command if isinstance(command, str) else _names(command, "command", where)
            env: dict[str, str | None] = dict.fromkeys(
                _names(data.get("env_set", ()), "env_set", where)
            )
            passed = list(_names(data.get("env_pass", ()), "env_pass", where))
            given = data.get("env", ())
            if isinstance(given, dict):
                if not all(isinstance(v, str) for v in given.values()):
                    raise ConfigError(
                        f'{where}: env values must be strings, as env = {{NAME = "value"}}'
                    )
                env.update(given)
            else:  # a list of names: passed from Keel's environment (as env_pass)
                passed[:0] = _names(given, "env", where)
            server = cls.stdio(argv, env=env, env_pass=passed, **common)
            overrides = _names(data.get("env_override", ()), "env_override", where)
            return dataclasses.replace(server, env_override=overrides) if overrides else server
        if url is not None and command is None:
            if data.get("env") or data.get("env_pass"):
                raise ConfigError(
                    f"{where}: env and env_pass are for stdio servers (a command), not a url"
                )
            return cls.http(_text(url, "url", where), **common)
        raise ConfigError(f"{where}: an MCP server needs either command or url (not both)")


def _check_url(url: str) -> None:
    parsed = http_url(url, "MCP server URL", "http://127.0.0.1:8000/mcp")
    if parsed.userinfo:
        raise ConfigError(
            "an MCP server URL must not carry a user name or password: it is saved with the run"
        )


def _names(value: Any, key: str, where: str) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}: {key} must be a list of strings")
    return tuple(value)


def _text(value: Any, key: str, where: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{where}: {key} must be a string")
    return value


def _number(value: Any, key: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{where}: {key} must be a number of seconds")
    return float(value)


# -- where specs come from ---------------------------------------------------------------------


def servers_from_flags(
    commands: Sequence[str], urls: Sequence[str], env: Sequence[str] = ()
) -> list[McpServer]:
    """`--mcp "CMD ARGS"` and `--mcp-url URL`, in the order given (commands first); either may
    begin ``prefix=NAME:`` to put NAME before each of that server's tool names. `env`: the
    `--mcp-env NAME=VALUE` flags, set for every `--mcp` server."""
    values = _flag_env(env)
    if values and not commands:
        raise ConfigError("--mcp-env is for --mcp servers (started here), and none was given")
    servers: list[McpServer] = []
    for text in commands:
        prefix, command = _flag_prefix(text)
        servers.append(McpServer.stdio(command, prefix=prefix, env=values))
    for text in urls:
        prefix, url = _flag_prefix(text)
        servers.append(McpServer.http(url, prefix=prefix))
    return servers


def resumed_values(
    settings: Mapping[str, JsonValue], flags: Sequence[str]
) -> dict[str, dict[str, str]]:
    """`keel resume --mcp-env NAME=VALUE`: the values given again, for every saved server of
    the run that sets NAME, by server name."""
    values = _flag_env(flags)
    saved = settings.get("mcp") or []
    names = [s.get("name") for s in saved if isinstance(s, dict)] if isinstance(saved, list) else []
    return {str(name): dict(values) for name in names if isinstance(name, str)}


def _flag_env(flags: Sequence[str]) -> dict[str, str]:
    values: dict[str, str] = {}
    for text in flags:
        name, sep, value = text.partition("=")
        if not (sep and _ENV_NAME.fullmatch(name)):
            raise ConfigError(
                f"--mcp-env {text!r}: write it as NAME=VALUE, e.g. "
                "--mcp-env MEMORY_FILE_PATH=/home/ana/memory.jsonl"
            )
        values[name] = value
    return values


_FLAG_PREFIX = re.compile(r"prefix=([A-Za-z0-9_-]*):(.*)", re.DOTALL)


def _flag_prefix(text: str) -> tuple[str, str]:
    """``prefix=web_:uvx mcp-server-fetch`` as ("web_", "uvx mcp-server-fetch")."""
    if not text.startswith("prefix="):
        return "", text
    match = _FLAG_PREFIX.fullmatch(text)
    if match is None or not match.group(2).strip():
        raise ConfigError(
            f"--mcp {text!r}: write the prefix as prefix=NAME:COMMAND (letters, digits, _ and -), "
            'e.g. "prefix=web_:python -m mcp_server_fetch"'
        )
    return match.group(1), match.group(2).strip()


def user_config_file() -> Path:
    return Path(platformdirs.user_config_dir("keel")) / "keel.toml"


def servers_from_config(path: Path | None = None) -> list[McpServer]:
    """The `[[mcp]]` tables of the user's own `keel.toml` (none when it does not exist)."""
    path = path or user_config_file()
    if not path.is_file():
        return []
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    tables = data.get("mcp", [])
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise ConfigError(f"{path}: mcp must be an array of tables ([[mcp]])")
    return [McpServer.from_json(t, f"{path} [[mcp]] #{i + 1}") for i, t in enumerate(tables)]


def servers_from_settings(
    settings: Mapping[str, JsonValue],
    *,
    values: Mapping[str, Mapping[str, str]] | None = None,
    config: Path | None = None,
) -> list[McpServer]:
    """The servers a stored run was started with (none for runs saved before MCP). The values
    of the variables they set, which are never saved, come from `values` (server name to
    values: what this process was given, for a run it starts) or else from the `[[mcp]]`
    table of the same name in the user's `keel.toml` (`config`); any still missing are read
    from Keel's environment when the server starts."""
    saved = settings.get("mcp") or []
    if not isinstance(saved, list):
        raise ConfigError("the run's saved MCP settings are not a list")
    servers = [McpServer.from_json(cast(dict[str, Any], s)) for s in saved]
    values = values or {}
    servers = [s.with_values(values.get(s.name, {})) for s in servers]
    if any(v is None for s in servers for _, v in s.env_values):
        tables = {t.name: dict(cast(Any, t.env_values)) for t in servers_from_config(config)}
        servers = [s.with_values(tables.get(s.name, {})) for s in servers]
    return servers
