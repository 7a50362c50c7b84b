"""What a walk of the file tools leaves out: what the repository ignores, and folders that are
not the project's own.

`make run` puts `.venv` inside the repository, and a search over "." spent its match cap in
site-packages: a newcomer's three questions about Keel were answered from numpy and anthropic
files (issue 45). A walk (`search_files`, and `list_files` for one folder) now skips:

- what the repository's `.gitignore` files ignore, the root's and every nested one below the
  root (each applies under its own folder, a deeper file over a higher one, as git reads them),
  and `.git/info/exclude`, matched by `pathspec`'s `GitIgnoreSpec`, a real gitignore matcher
  (negations, anchors, `**`, folder-only patterns): a hand-written one gets these wrong;
- folders that are not the project's own whatever any `.gitignore` says, known by a marker:
  a virtual environment (a `pyvenv.cfg` in it), a tagged cache (`CACHEDIR.TAG`, written by
  pytest, mypy, ruff and others), `__pycache__` and `node_modules`; `.git` is never walked.

A walk that starts at a path the rules would skip (the model named `.venv` itself) applies none
of them: a path named is read. `read_file` never consults them. What was skipped is counted
(`Skipped`) so the tool can say what it left out and the call that reads it.

Files are read the way the rest of the tools read (`keel.tools.confine`): relative to a held
directory descriptor, without following a link, regular files with one name only, bounded.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from keel.tools.confine import ALWAYS_SKIPPED
from keel.tools.fileio import FileToolError

if TYPE_CHECKING:
    from pathspec import GitIgnoreSpec

    from keel.tools.confine import Root

__all__ = ["SKIPPED_NOTE", "IgnoreRules", "Skipped", "skipped_in"]

MARKED_BY_NAME = {
    "__pycache__": "a Python bytecode cache",
    "node_modules": "installed npm packages",
}
MARKER_FILES = {
    "pyvenv.cfg": "a virtual environment",
    "CACHEDIR.TAG": "a cache (CACHEDIR.TAG)",
}
"""A folder holding one of these files is skipped, for the reason given."""
MAX_IGNORE_FILE_BYTES = 256_000
"""A `.gitignore` larger than this is read up to here (a repository could hold any file)."""
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_ENTER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


SKIPPED_NOTE = "as the repository ignores them or they are not its own code"
"""The words of a result's note on what a walk skipped (`keel show` finds the note by them)."""
NAMED_IN_A_NOTE = 8
"""Skipped folders (and files) a note names; the rest are counted."""


@dataclass
class Skipped:
    """What one walk left out, for the tool's result."""

    folders: list[tuple[str, str]] = field(default_factory=list)
    """(path, why) of each folder skipped, in walk order."""
    files: list[str] = field(default_factory=list)
    """Files a `.gitignore` pattern ignores (the first `NAMED_IN_A_NOTE`)."""
    file_count: int = 0

    @property
    def anything(self) -> bool:
        return bool(self.folders or self.file_count)

    def note(self, what: str, call: Callable[[str], str]) -> str | None:
        """``[not searched: .venv (a virtual environment), ...; a path named is read whole:
        CALL]``, where `call` makes the call for a path; None when nothing was skipped."""
        if not self.anything:
            return None
        named = [f"{path} ({why})" for path, why in self.folders[:NAMED_IN_A_NOTE]]
        if len(self.folders) > NAMED_IN_A_NOTE:
            named.append(f"{len(self.folders) - NAMED_IN_A_NOTE} more folders")
        if self.file_count:
            files = ", ".join(self.files[:NAMED_IN_A_NOTE])
            more = "" if self.file_count <= NAMED_IN_A_NOTE else ", ..."
            plural = "file" if self.file_count == 1 else "files"
            named.append(f"{self.file_count} {plural} a .gitignore ignores ({files}{more})")
        first = self.folders[0][0] if self.folders else self.files[0]
        listed = "; ".join(named)
        return f"[{what}, {SKIPPED_NOTE}: {listed}. A path named is read whole: {call(first)}]"


@dataclass(frozen=True)
class _Spec:
    folder: str
    """The folder whose `.gitignore` this is, relative to the root ("" for the root)."""
    source: str
    spec: GitIgnoreSpec


class IgnoreRules:
    """The rules in force in one folder of a walk, and what the walk has skipped so far."""

    def __init__(self, specs: tuple[_Spec, ...], skipped: Skipped, active: bool = True) -> None:
        self._specs = specs
        self.skipped = skipped
        self.active = active
        """False when the walk started at a path the rules would skip: nothing is skipped."""

    @classmethod
    def for_walk(cls, root: Root, start: str) -> IgnoreRules:
        """The rules at `start` (relative to the root, links resolved): the `.gitignore` files
        of the root and of each folder above `start`; none at all when `start` or a folder
        above it is itself ignored or marked (a path named is read)."""
        rules = cls((), Skipped())
        folders = [] if start == "." else start.split("/")
        for depth in range(len(folders) + 1):
            rel = "/".join(folders[:depth]) or "."
            try:
                opened = root.open(rel)
            except (OSError, FileToolError):  # the walk's own open says what is wrong
                return cls((), Skipped(), active=False)
            with opened:
                if depth and rules.folder_skipped(opened.fd, rel) is not None:
                    return cls((), Skipped(), active=False)
                rules = rules.read_folder(opened.fd, rel, exclude=depth == 0)
        return rules

    def read_folder(self, fd: int, rel: str, *, exclude: bool = False) -> IgnoreRules:
        """These rules with the `.gitignore` of the folder `fd` (`rel`) added, and with
        `exclude`, the repository's `.git/info/exclude` (read at the root only)."""
        if not self.active:
            return self
        folder = "" if rel == "." else rel
        added = []
        if exclude:
            info = _read_info_exclude(fd)
            if info:
                added.append(_Spec(folder, ".git/info/exclude", _compiled(info)))
        text = _read_small(fd, ".gitignore")
        if text:
            added.append(_Spec(folder, f"{folder}/.gitignore" if folder else ".gitignore",
                               _compiled(text)))  # fmt: skip
        if not added:
            return self
        return IgnoreRules((*self._specs, *added), self.skipped)

    def file_skipped(self, rel: str) -> bool:
        """Whether a walk leaves the file `rel` out (counted when it does)."""
        if not self.active or self._matched(rel, is_dir=False) is None:
            return False
        self.skipped.file_count += 1
        if len(self.skipped.files) < NAMED_IN_A_NOTE:
            self.skipped.files.append(rel)
        return True

    def entry_skipped(self, fd: int, name: str, rel: str, found: os.stat_result) -> bool:
        """For a listing of the open folder `fd`: whether its entry `name` (`rel`, `lstat`
        `found`) is left out. A link is listed as it is."""
        if name in ALWAYS_SKIPPED:
            return True
        if stat.S_ISREG(found.st_mode):
            return self.file_skipped(rel)
        if not stat.S_ISDIR(found.st_mode) or not self.active:
            return False
        try:
            child = os.open(name, _ENTER, dir_fd=fd)
        except OSError:
            return False
        try:
            return self.folder_skipped(child, rel) is not None
        finally:
            os.close(child)

    def folder_skipped(self, fd: int, rel: str) -> str | None:
        """Why a walk leaves the folder `rel` (open as `fd`) out, or None when it goes in;
        the folder is recorded in `skipped` when it is left out."""
        if not self.active:
            return None
        name = rel.rsplit("/", 1)[-1]
        why = MARKED_BY_NAME.get(name) or _marker_in(fd)
        if why is None and (pattern := self._matched(rel, is_dir=True)) is not None:
            why = pattern
        if why is not None:
            self.skipped.folders.append((rel, why))
        return why

    def _matched(self, rel: str, *, is_dir: bool) -> str | None:
        """The pattern that ignores `rel` ("build/ in .gitignore"), or None: the deepest
        `.gitignore` with a matching pattern decides, its last matching pattern within it."""
        for spec in reversed(self._specs):
            if spec.folder and not rel.startswith(spec.folder + "/"):
                continue
            below = rel[len(spec.folder) + 1 :] if spec.folder else rel
            result = spec.spec.check_file(below + "/" if is_dir else below)
            if result.include is None:
                continue
            if not result.include or result.index is None:
                return None  # re-included by a "!" pattern
            pattern = getattr(spec.spec.patterns[result.index], "pattern", None)
            return f"{pattern} in {spec.source}" if pattern else spec.source
        return None


def _compiled(text: str) -> GitIgnoreSpec:
    from pathspec import GitIgnoreSpec  # on a walk's first .gitignore: no cost at start

    return GitIgnoreSpec.from_lines(text.splitlines())


def _marker_in(fd: int) -> str | None:
    for marker, why in MARKER_FILES.items():
        try:
            found = os.stat(marker, dir_fd=fd, follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISREG(found.st_mode):
            return why
    return None


def _read_info_exclude(root_fd: int) -> str:
    """`.git/info/exclude`, each folder entered without following a link."""
    fd = root_fd
    opened: list[int] = []
    try:
        for name in (".git", "info"):
            fd = os.open(name, _ENTER, dir_fd=fd)
            opened.append(fd)
        return _read_small(fd, "exclude")
    except OSError:
        return ""
    finally:
        for held in opened:
            os.close(held)


def _read_small(fd: int, name: str) -> str:
    """The text of the regular, singly linked file `name` in the folder `fd`, up to
    `MAX_IGNORE_FILE_BYTES`; "" when there is none or it cannot be read."""
    try:
        held = os.open(name, _READ, dir_fd=fd)
    except OSError:
        return ""
    with os.fdopen(held, "rb") as handle:
        found = os.fstat(handle.fileno())
        if not stat.S_ISREG(found.st_mode) or found.st_nlink > 1:
            return ""
        data = handle.read(MAX_IGNORE_FILE_BYTES)
    return data.decode("utf-8", errors="replace")


def skipped_in(result: str) -> str | None:
    """What a search or listing result says it skipped (``.venv (a virtual environment); ...``),
    or None: for `keel show`, which prints a result's first line only."""
    for line in result.splitlines():
        if line.startswith("[") and f", {SKIPPED_NOTE}: " in line:
            return line.split(f", {SKIPPED_NOTE}: ", 1)[1].split(". A path named", 1)[0]
    return None
