"""Which store a command uses, and opening it: a SQLite file path, or a `postgresql://` URL.

`--store`, then `KEEL_STORE`, then `store = "..."` in `keel.toml` (working directory, then the
user config directory), then the SQLite file under the user data directory. A URL's password
is never shown: `redact` replaces it wherever the store is named (messages, `path`), and the
Postgres store never writes it anywhere.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import platformdirs

from keel.errors import ConfigError
from keel.store.protocol import RunStore
from keel.store.urls import redact

__all__ = ["default_store_path", "is_url", "open_store", "redact", "store_target"]

SCHEMES = ("postgresql://", "postgres://")


def default_store_path() -> Path:
    return Path(platformdirs.user_data_dir("keel")) / "keel.sqlite"


def is_url(target: str | Path) -> bool:
    return isinstance(target, str) and target.startswith(SCHEMES)


def store_target(
    given: str | Path | None,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> str | Path:
    """The store a command means: a URL (str) or a file path (Path)."""
    if given is not None and str(given) != "":
        return str(given) if is_url(str(given)) else Path(given)
    env = os.environ if env is None else env
    if env.get("KEEL_STORE"):
        value = env["KEEL_STORE"]
        return value if is_url(value) else Path(value)
    from keel.config import config_files  # trusted copies only: a repository's is ignored

    files, _ = config_files(cwd)
    for found in files:
        named = found.data.get("store")
        if named is None:
            continue
        if not isinstance(named, str) or not named:
            raise ConfigError(f'{found.path}: store must be a file path or a "postgresql://" URL')
        return named if is_url(named) else Path(named).expanduser()
    return default_store_path()


def open_store(target: str | Path, *, read_only: bool = False) -> RunStore:
    """Open the store at a path or URL. `read_only`: never write to it (`keel runs`/`show`)."""
    if is_url(target):
        from keel.store.postgres_store import PostgresStore

        return PostgresStore(str(target), read_only=read_only)
    from keel.store.sqlite_store import Store

    return Store(target, read_only=read_only)
