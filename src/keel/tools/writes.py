"""`write_file`: the built-in side-effecting tool, confined to the repository and worth approving.

It is off unless the user asks for it (`--allow-writes`) and asks for approval on every call
unless pre-granted (`--approve-tools write_file`). Nothing under a `.git` folder is ever
written, even through a link. Appending is supported so that repeated effects are visible (and
countable) rather than silently overwritten.
"""

from __future__ import annotations

import os
from pathlib import Path

from keel.failpoints import failpoint
from keel.tools.base import Effect, Tool, make_tool
from keel.tools.fileio import FileToolError, open_for_write
from keel.tools.files import Root

__all__ = ["MAX_WRITE_CHARS", "write_tools"]

MAX_WRITE_CHARS = 1_000_000


def write_tools(root: str | os.PathLike[str]) -> list[Tool]:
    """`write_file` under `root`; side_effecting, requires approval."""
    base = Root(root)

    def write_file(path: str, content: str, append: bool = False) -> str:
        """Write text to a file of the repository (creating folders as needed), or append to
        it with append=true. Paths are relative to the repository root; nothing outside it can
        be written. A person approves each write unless it was pre-approved."""
        return _write(base, path, content, append)

    return [
        make_tool(
            write_file,
            description=" ".join((write_file.__doc__ or "").split()),
            effect=Effect.SIDE_EFFECTING,
            requires_approval=True,
        )
    ]


def _write(base: Root, path: str, content: str, append: bool) -> str:
    if len(content) > MAX_WRITE_CHARS:
        raise FileToolError(f"content is {len(content)} characters; the limit is {MAX_WRITE_CHARS}")
    target = base.resolve(path)
    if any(part.casefold() == ".git" for part in Path(base.rel(target)).parts):
        raise FileToolError(f"{path!r} is inside .git (version-control metadata), never written")
    if target.is_dir():
        raise FileToolError(f"{path!r} is a directory")
    parent = Path(os.path.realpath(target.parent))
    if not base.contains(parent):
        raise FileToolError(f"{path!r} is outside the repository")
    parent.mkdir(parents=True, exist_ok=True)
    failpoint("before_side_effect")
    with open_for_write(target, path, append) as handle:
        handle.write(content.encode("utf-8"))
    failpoint("inside_side_effect")
    verb = "appended" if append else "wrote"
    return f"{verb} {len(content)} characters to {base.rel(target)}"
