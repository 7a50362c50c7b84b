"""`keel.toml`: where settings are read from, and which copies may be believed.

Two places hold a `keel.toml`: the user's config folder (theirs, always read) and the working
directory. The working directory is often a repository Keel did not write (`keel run … --repo
.`), and a `base_url` there would send the user's API key, and every prompt, to a host of the
repository's choosing. So a working-directory file is read only once the user has trusted it
(`keel trust`), and trust is pinned to the file's sha256: a trusted file that changes is
untrusted again until the user looks at it anew. An untrusted file is ignored with a warning
that says how to trust it.

Trust grants the file's model, base_url and ordinary settings. The keys that would reach
further (`RISKY`: the key sent to the base_url, writes and pre-approved tools, hosts the guard
lets through, sub-agents) are each granted by name (`keel trust --grant KEY`), and recorded
beside the digest; one not granted is left out, with a warning naming it (ADR 0062, TR-02).

A key Keel does not know is named on stderr with the closest valid one
(`keel.run_options.unknown_keys`), not
refused: the same file is read by older and newer Keels (dotfiles, a repository trusted on
several machines), and a key a newer Keel added must not stop every command of an older one.
A value Keel cannot use is still an error, where it is read.

`public_url` is what may be stored or printed of an endpoint: no user, password or
secret-looking query parameter.
"""

from __future__ import annotations

import hashlib
import json
import os
import tomllib
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import platformdirs

from keel.errors import ConfigError

if TYPE_CHECKING:  # httpx is imported by the checks that parse a URL, not by every command
    import httpx

__all__ = [
    "CONFIG_NAME",
    "RISKY",
    "TABLES",
    "ConfigFile",
    "config_files",
    "granted",
    "http_url",
    "public_url",
    "trust",
    "trust_state",
]

CONFIG_NAME = "keel.toml"
TRUST_NAME = "trusted.json"
SECRET_PARAMETERS = frozenset(
    {"key", "api-key", "api_key", "apikey", "token", "access_token", "auth", "password",
     "secret", "sig", "signature", "code", "x-api-key"}
)  # fmt: skip

RISKY: dict[str, str] = {
    "api_key_env": "sends the key in that variable of your environment to the file's base_url",
    "allow_writes": "offers write_file, so the model may write under --repo",
    "approve_tools": "runs those tools without asking you, writes included",
    "allow_hosts": "lets fetch reach those loopback, private or cloud-metadata hosts",
    "agents": "declares sub-agents, with their own tools and pre-approvals",
    "hosted_tools": "lets the model's provider run those tools (web searches billed per call)",
}
"""What a working-directory keel.toml may say that trust alone does not grant: each is
granted by name, and what it does is said when trust is asked for."""

TABLES = ("mcp", "prices", "agents")
"""The keel.toml tables beside the run options' keys (keel/run_options.py): `[[mcp]]`
(tools/mcp_servers.py, which refuses unknown keys inside a table), `[prices.PROVIDER]`
(pricing.py) and `[agents.NAME]` (sub-agents, keel/run_options.py `agent_tables`)."""


@dataclass(frozen=True, slots=True)
class ConfigFile:
    path: Path
    data: dict[str, object]


def user_config_dir() -> Path:
    return Path(platformdirs.user_config_dir("keel"))


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _trusted() -> dict[str, str]:
    path = user_config_dir() / TRUST_NAME
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def trust_state(path: Path) -> str:
    """"trusted", "changed" (trusted once, edited since) or "untrusted"."""
    known = _trusted().get(str(path.resolve()))
    if known is None:
        return "untrusted"
    return "trusted" if known.partition("+")[0] == _digest(path) else "changed"


def granted(path: Path) -> frozenset[str]:
    """The risky keys trust granted the file by name (none for an entry that names none)."""
    known = _trusted().get(str(path.resolve()), "")
    return frozenset(k for k in known.partition("+")[2].split(",") if k)


def trust(folder: Path, grant: Collection[str] = ()) -> Path:
    """Trust the `keel.toml` in `folder` as it is now, and the risky keys in `grant` (which
    must be keys of `RISKY`); returns the file trusted."""
    unknown = sorted(set(grant) - set(RISKY))
    if unknown:
        raise ConfigError(
            f"--grant {unknown[0]}: not a key trust grants by name; those are {', '.join(RISKY)}"
        )
    path = (folder / CONFIG_NAME).resolve()
    if not path.is_file():
        raise ConfigError(f"no {CONFIG_NAME} in {folder.resolve()}")
    _read(path)  # refuse to trust a file Keel cannot read
    entries = _trusted()
    entries[str(path)] = _digest(path) + ("+" + ",".join(sorted(grant)) if grant else "")
    target = user_config_dir() / TRUST_NAME
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_suffix(".tmp")
    temporary.write_text(json.dumps(entries, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(temporary, target)
    return path


def _read(path: Path) -> dict[str, object]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None


def config_files(cwd: Path | None = None) -> tuple[list[ConfigFile], list[str]]:
    """The files to believe, working directory first, and warnings about files ignored."""
    here = (cwd or Path.cwd()) / CONFIG_NAME
    files, warnings = [], []
    if here.is_file():
        state = trust_state(here)
        if state == "trusted":
            data, allowed = _read(here), granted(here)
            for key in sorted(set(data) & set(RISKY) - allowed):
                warnings.append(
                    f"ignoring {key} in {here}: trusting the file did not grant it ({key} "
                    f"{RISKY[key]}); `keel trust --grant {key}` grants it"
                )
            kept = {k: v for k, v in data.items() if k not in RISKY or k in allowed}
            files.append(ConfigFile(here, kept))
        else:
            why = "changed since you trusted it" if state == "changed" else "not trusted"
            warnings.append(
                f"ignoring {here} ({why}): a {CONFIG_NAME} in the working directory can send "
                f"your API key elsewhere; read it, then run `keel trust` to use it"
            )
    mine = user_config_dir() / CONFIG_NAME
    if mine.is_file():
        files.append(ConfigFile(mine, _read(mine)))
    return files, warnings


def http_url(url: str, what: str, example: str) -> httpx.URL:
    """`url` parsed, when it is an http(s) URL with a host; otherwise a ConfigError naming it as
    `what` ("base URL", "MCP server URL") with an `example` of a good one."""
    import httpx

    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise ConfigError(f"{what} {url!r} is not a valid URL: {exc}") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ConfigError(
            f"{what} {url!r} must be an http:// or https:// URL with a host, e.g. {example}"
        )
    return parsed


def public_url(url: str) -> str:
    """`url` without user, password or secret-looking query parameters: safe to store and print."""
    parts = urlsplit(url)
    netloc = parts.hostname or ""
    if ":" in netloc:  # an IPv6 literal
        netloc = f"[{netloc}]"
    if parts.port is not None:
        netloc += f":{parts.port}"
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True)
             if k.lower() not in SECRET_PARAMETERS]  # fmt: skip
    return urlunsplit((parts.scheme, netloc, parts.path, urlencode(query), ""))
