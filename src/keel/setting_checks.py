"""Settings that would silently do nothing are refused, naming the closest valid value.

`--allow-host http://127.0.0.1:18080` (a URL where a host is meant) used to match no host, and
`--approve-tools write-file` (no such tool) approved nothing: the run then behaved as if the
option had not been given, and nobody was told.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Iterable
from urllib.parse import urlsplit

from keel.errors import ConfigError

__all__ = ["check_hosts", "check_tool_names"]


def check_hosts(hosts: Iterable[str]) -> None:
    """Each allowed host is a host name or address, not a URL or a path."""
    for host in hosts:
        if "://" in host or "/" in host or not host.strip():
            guess = urlsplit(host if "://" in host else f"//{host}").hostname
            hint = f"; did you mean {guess}?" if guess else ""
            raise ConfigError(
                f"--allow-host takes a host name or address, not {host!r}{hint}"
            )


def check_tool_names(names: Iterable[str], tools: Collection[str], what: str) -> None:
    """Every named tool exists; else say which and what is closest."""
    for name in names:
        if name in tools:
            continue
        close = difflib.get_close_matches(name, list(tools), n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        known = ", ".join(sorted(tools)) or "none"
        raise ConfigError(f"{what} names no tool {name!r}{hint} (tools: {known})")
