"""`write_file`: the built-in side-effecting tool, confined to the repository and worth approving.

It is off unless the user asks for it (`--allow-writes`) and asks for approval on every call
unless pre-granted (`--approve-tools write_file`). Nothing under a `.git`, `.hg` or `.svn`
folder is ever written, even through a link; the path is opened through `keel.tools.confine`,
so no link, hard link or race leads a write outside the repository. Appending is supported so
that repeated effects are visible (and countable) rather than silently overwritten.
"""

from __future__ import annotations

import os

from keel.failpoints import failpoint
from keel.tools.base import Effect, Tool, make_tool
from keel.tools.confine import Root
from keel.tools.fileio import FileToolError

__all__ = ["MAX_WRITE_CHARS", "VCS_DIRS", "write_tools"]

MAX_WRITE_CHARS = 1_000_000
VCS_DIRS = frozenset({".git", ".hg", ".svn"})
"""Version-control metadata: never written, whatever the case (compared casefolded)."""


def write_tools(root: str | os.PathLike[str]) -> list[Tool]:
    """`write_file` under `root`; side_effecting, requires approval."""
    base = Root(root)

    def write_file(path: str, content: str, append: bool = False) -> str:
        """Write text to a file of the repository (creating folders as needed), or append to
        it with append=true. Paths are relative to the repository root; nothing outside it can
        be written, nor anything under .git, .hg or .svn, nor a file with several hard links.
        A person approves each write unless it was pre-approved."""
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
    failpoint("before_side_effect")
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else 0)
    try:
        opened = base.open(path, flags, make_dirs=True, refuse=VCS_DIRS)
    except FileNotFoundError:
        raise FileToolError(f"{path!r}: a part of the path is a file, not a folder") from None
    with opened.file("ab" if append else "wb") as handle:
        if not append:
            handle.truncate(0)  # only now that the descriptor is known to be a regular file
        handle.write(content.encode("utf-8"))
        handle.flush()
        size = os.fstat(handle.fileno()).st_size
    failpoint("inside_side_effect")
    if append:  # what changed, so a log of appends never reads as one result again and again
        return f"appended {len(content)} characters to {opened.rel} (it now holds {size} bytes)"
    return f"wrote {len(content)} characters to {opened.rel}"
