"""A scenario's `web_search`: over a SearXNG-shaped page of its page server, or over a local
index of its files, built the way `keel index` builds it before the run starts (ADR 0061)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from keel.errors import ConfigError
from keel.tools.base import Tool

__all__ = ["search_tool"]


def search_tool(spec: str, *, base: str, folder: Path, allow_hosts: Sequence[str]) -> Tool:
    """`web_search` for ``[tools] search``: ``searxng:{base}/PATH`` with the page server's
    address put in, or ``local:FOLDER`` under the scenario's folder of files, indexed now."""
    from keel.tools.search_backends import backend_from_spec
    from keel.tools.web_search import search_tools

    kind, _, rest = spec.partition(":")
    if kind == "local":
        from keel.tools.local_index import refresh_index

        corpus = (folder / rest).resolve()
        if not corpus.is_relative_to(folder.resolve()) or not corpus.is_dir():
            raise ConfigError(f"tools.search {spec!r}: a folder of the scenario's files")
        refresh_index(corpus)
        backend = backend_from_spec(f"local:{corpus}", repo=str(folder))
    else:
        backend = backend_from_spec(spec.replace("{base}", base), allow_hosts=allow_hosts)
    [tool] = search_tools(backend)
    return tool
