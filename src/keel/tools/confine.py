"""Opening a path beneath a directory handle, never following a link out.

The file tools used to resolve a path to its real path, check that it lay inside the root, and
then open it by name. Between the check and the open, any directory on the way could be swapped
for a link to somewhere else, and the kernel followed it (issue 10 measured thousands of
outside reads and writes in 30 s). Here the kernel never resolves more than one name: the root
is held open, every component is opened relative to the directory before it with
``O_NOFOLLOW``, and a link is never followed by the kernel. A link met on the way is read and
its target walked again by this module, from the directory that holds it or, for an absolute
target, from the root handle: a target outside the root is refused, as is ``..`` at the root.
So what is opened is decided by directory handles this module opened itself, never by a name
the kernel re-reads later.

``..`` is never passed to the kernel as a path to follow blindly: it opens the parent of the
current directory and checks it is the very directory the walk came through (device and inode),
so a directory moved out of the root mid-walk cannot lead outside.

A regular file with more than one name (``st_nlink > 1``) is refused, for reading and writing:
a hard link is the same file under another name, and nothing can tell whether that other name
lies inside the root (``os.link`` of an outside file into the repository looks exactly like
any other file). Special files (FIFOs, devices, sockets) are refused after ``lstat``, before they
are ever opened, and opening is non-blocking and checked again with ``fstat``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import weakref
from collections.abc import Iterator
from pathlib import Path, PurePath
from types import TracebackType
from typing import BinaryIO, Protocol, cast

from keel.errors import ConfigError
from keel.tools.fileio import FileToolError, not_regular

__all__ = [
    "ALWAYS_SKIPPED",
    "MAX_LINK_HOPS",
    "MAX_WALK_DEPTH",
    "HardLinked",
    "Opened",
    "Outside",
    "Root",
    "Walk",
    "WalkRules",
]

MAX_LINK_HOPS = 40
"""Links followed (and races retried) while opening one path, as Linux's own MAXSYMLINKS."""
MAX_WALK_DEPTH = 128
"""Directories deep a walk goes: each level holds one descriptor while its children are read."""
MAX_PATH_CHARS = 4096
ALWAYS_SKIPPED = frozenset({".git"})
"""Never walked nor listed, and never mentioned: version-control metadata."""
_ENTER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_READ_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CHANGED = (errno.ELOOP, errno.ENOTDIR, errno.EMLINK, errno.ENOENT)
"""What opening a name the `lstat` just saw gives when it has been swapped or removed since
(``O_NOFOLLOW`` on a link: ELOOP, or ENOTDIR with ``O_DIRECTORY``, EMLINK on BSDs)."""


class Opened:
    """An open descriptor below the root, with the path it was reached by (relative to the root,
    links resolved) and its `fstat`. Closes the descriptor on exit unless it was handed on."""

    __slots__ = ("fd", "rel", "st")

    def __init__(self, fd: int, rel: str, st: os.stat_result) -> None:
        self.fd = fd
        self.rel = rel
        self.st = st

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.st.st_mode)

    def detach(self) -> int:
        """The descriptor, now the caller's to close."""
        fd, self.fd = self.fd, -1
        return fd

    def file(self, mode: str = "rb") -> BinaryIO:
        """A file object that now owns the descriptor."""
        return cast(BinaryIO, os.fdopen(self.detach(), mode))

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

    def __enter__(self) -> Opened:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class Walk:
    """What a walk skipped, for the tool to say so."""

    def __init__(self) -> None:
        self.hard_links = 0
        self.too_deep = 0


class WalkRules(Protocol):
    """What a walk leaves out, folder by folder (`keel.tools.ignore.IgnoreRules`)."""

    def file_skipped(self, rel: str) -> bool: ...

    def folder_skipped(self, fd: int, rel: str) -> str | None: ...

    def read_folder(self, fd: int, rel: str) -> WalkRules: ...


class Outside(FileToolError):
    """A path, or a link on its way, that leads outside the root."""

    def __init__(self, requested: str) -> None:
        super().__init__(f"{requested!r} is outside the repository; use a path inside it")


class HardLinked(FileToolError):
    """A regular file with more than one name: never read or written (module docstring)."""

    def __init__(self, requested: str, links: int) -> None:
        super().__init__(
            f"{requested!r} is a hard link ({links} names for one file); a hard-linked file may "
            "be a file outside the repository, so it is never read or written"
        )


class Root:
    """The one directory the file tools may touch, held open for as long as the tools live."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.path = Path(root).resolve()
        self._given = Path(os.path.abspath(root))
        try:
            self.fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise ConfigError(f"file tools: root {str(root)!r} is not a directory") from exc
        weakref.finalize(self, os.close, self.fd)
        self.identity = _identity(os.fstat(self.fd))

    def open(
        self,
        requested: str,
        flags: int = os.O_RDONLY,
        *,
        make_dirs: bool = False,
        refuse: frozenset[str] = frozenset(),
    ) -> Opened:
        """Open what `requested` names: a regular file, or a directory when `flags` only read.

        Links inside the root are followed by walking their target again; a missing file is
        created when `flags` has ``O_CREAT``, and missing directories too with `make_dirs`. A
        component whose name casefolds into `refuse` is refused before anything is created.
        Raises FileNotFoundError for a missing path, FileToolError for a refused one.
        """
        return _Resolution(self, requested, flags, make_dirs, refuse).run(open_last=True)

    def lookup(self, requested: str) -> os.stat_result:
        """What `requested` is, links followed inside the root, without opening it."""
        return _Resolution(self, requested, os.O_RDONLY, False, frozenset()).run(False).st

    def components(self, requested: str, *, slash_is_root: bool = False) -> list[str]:
        """`requested` as names below the root; an absolute path must lie (as written) inside,
        unless `slash_is_root`: then one that does not names a path below the root ("/src" is
        "src"), as models that see the repository as "/" write it. Never for writes (the
        approver must see the path that is written) nor for link targets."""
        if len(requested) > MAX_PATH_CHARS:
            raise FileToolError(f"a path of {len(requested)} characters; at most {MAX_PATH_CHARS}")
        path = PurePath(requested)
        if not path.is_absolute():
            return list(path.parts)
        for base in (self.path, self._given):
            if path.parts[: len(base.parts)] == base.parts:
                return list(path.parts[len(base.parts) :])
        if slash_is_root:
            return list(path.parts[1:])
        raise Outside(requested)

    def entries(self, directory: Opened) -> list[tuple[str, os.stat_result]]:
        """The names in an open directory, sorted, each with its `lstat`, taken through the
        directory's descriptor: the listing is of the directory that was opened."""
        found = []
        with os.scandir(directory.fd) as scan:
            for entry in scan:
                try:
                    found.append((entry.name, entry.stat(follow_symlinks=False)))
                except FileNotFoundError:
                    continue  # removed since the directory was read
        return sorted(found, key=lambda item: item[0])

    def walk(self, top: Opened, rules: WalkRules, walk: Walk) -> Iterator[Opened]:
        """Regular files under the open directory `top`, each opened, sorted: a directory's
        files, then its subdirectories. A link to a file inside the root is followed; a link to
        a directory never is (that is how a walk loops), nor one leading outside. What `rules`
        (the rules in force at `top`) leave out is not walked; `.git` never is."""
        yield from self._walk(top.fd, top.rel, 1, rules, walk)

    def _walk(
        self, fd: int, rel: str, depth: int, rules: WalkRules, walk: Walk
    ) -> Iterator[Opened]:
        with os.scandir(fd) as scan:
            names = sorted((e.name, _kind(e)) for e in scan)
        for name, kind in names:
            path = _join(rel, name)
            if kind in ("file", "link") and not rules.file_skipped(path):
                found = self._walked_file(fd, name, path, kind == "link", walk)
                if found is not None:
                    yield found
        for name, kind in names:
            if kind != "dir" or name in ALWAYS_SKIPPED:
                continue
            if depth >= MAX_WALK_DEPTH:
                walk.too_deep += 1
                continue
            try:
                child = os.open(name, _ENTER, dir_fd=fd)
            except OSError:
                continue  # replaced (by a link, a file) or removed since the listing
            try:
                path = _join(rel, name)
                if rules.folder_skipped(child, path) is None:
                    inside = rules.read_folder(child, path)
                    yield from self._walk(child, path, depth + 1, inside, walk)
            finally:
                os.close(child)

    def _walked_file(
        self, fd: int, name: str, path: str, is_link: bool, walk: Walk
    ) -> Opened | None:
        """A file met by a walk, opened, or None when it is skipped (quietly, as before: a
        walk is not asked for any one file)."""
        try:
            if is_link:
                found = self.open(path)
                if found.is_dir:
                    found.close()
                    return None
                return Opened(found.detach(), path, found.st)
            opened = os.open(name, _READ_FILE, dir_fd=fd)
        except HardLinked:
            walk.hard_links += 1
            return None
        except (FileToolError, OSError):
            return None  # outside, special, removed, or swapped since the listing
        st = os.fstat(opened)
        if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
            return Opened(opened, path, st)
        os.close(opened)  # never read: a special file swapped in, or a hard link
        if stat.S_ISREG(st.st_mode):
            walk.hard_links += 1
        return None


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _join(rel: str, name: str) -> str:
    return name if rel == "." else f"{rel}/{name}"


def _kind(entry: os.DirEntry[str]) -> str:
    """From the directory's own record where it has one: no `stat`, and nothing opened."""
    if entry.is_symlink():
        return "link"
    if entry.is_dir(follow_symlinks=False):
        return "dir"
    return "file" if entry.is_file(follow_symlinks=False) else "special"


class _Resolution:
    """One walk of one path from the root, by the rules of the module docstring."""

    def __init__(
        self, root: Root, requested: str, flags: int, make_dirs: bool, refuse: frozenset[str]
    ) -> None:
        self.root, self.requested, self.flags = root, requested, flags
        self.make_dirs, self.refuse = make_dirs, refuse
        self.writing = bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))
        self.pending: list[str] = []
        self._extend(root.components(requested, slash_is_root=not self.writing))
        self.fd = root.fd  # the current directory
        self.parts: list[str] = []  # its names from the root: the real path, links resolved
        self.ids: list[tuple[int, int]] = []  # the identity of each directory entered
        self.hops = 0

    def run(self, open_last: bool) -> Opened:
        try:
            return self._run(open_last)
        finally:
            self._leave()

    def _run(self, open_last: bool) -> Opened:
        while self.pending:
            name = self.pending.pop()
            if name in ("", "."):
                continue
            if name == "..":
                self._up()
                continue
            last = not self.pending
            try:
                st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
            except FileNotFoundError:
                if last and open_last and self.flags & os.O_CREAT:
                    if (created := self._create(name)) is not None:
                        return created
                elif not last and self.make_dirs:
                    self._mkdir(name)
                else:
                    raise
                continue
            if stat.S_ISLNK(st.st_mode):
                self._follow(name)
            elif last and not open_last:
                return Opened(-1, self._rel(name), st)
            elif last and not stat.S_ISDIR(st.st_mode):
                if (opened := self._open_file(name, st)) is not None:
                    return opened
            elif not stat.S_ISDIR(st.st_mode):
                raise FileNotFoundError(errno.ENOTDIR, "not a directory", self.requested)
            else:
                self._enter(name)
        # The path named a directory: the one entered last, or the root itself.
        if self.writing:
            raise FileToolError(f"{self.requested!r} is a directory")
        if not open_last:
            return Opened(-1, self._rel(None), os.fstat(self.fd))
        if self.fd == self.root.fd:  # a descriptor of its own: scandir moves its offset
            return _opened(os.open(".", _ENTER, dir_fd=self.root.fd), ".")
        fd, self.fd = self.fd, self.root.fd  # handed on: not closed on leaving
        return _opened(fd, self._rel(None))

    def _leave(self) -> None:
        if self.fd != self.root.fd:
            os.close(self.fd)
        self.fd = self.root.fd

    def _rel(self, name: str | None) -> str:
        return "/".join([*self.parts, name] if name is not None else self.parts) or "."

    def _hop(self) -> None:
        self.hops += 1
        if self.hops > MAX_LINK_HOPS:
            raise FileToolError(
                f"{self.requested!r}: too many symbolic links on the way (more than "
                f"{MAX_LINK_HOPS}), or it kept changing while being opened"
            )

    def _retry(self, name: str) -> None:
        """The entry changed between `lstat` and `open` (a race, or a link swapped in)."""
        self._hop()
        self.pending.append(name)

    def _follow(self, name: str) -> None:
        self._hop()
        try:
            target = os.readlink(name, dir_fd=self.fd)
        except OSError:
            self.pending.append(name)  # no longer a link: look again
            return
        if os.path.isabs(target):
            try:  # refused unless it lies inside, as written
                rest = self.root.components(target)
            except Outside:
                raise Outside(self.requested) from None
            self._leave()
            self.parts, self.ids = [], []
        else:
            rest = list(PurePath(target).parts)
        self._extend(rest)

    def _extend(self, names: list[str]) -> None:
        """Names to walk next; one in `refuse` is refused now, before anything is created."""
        for name in names:
            if name.casefold() in self.refuse:
                raise FileToolError(
                    f"{self.requested!r} is inside {name.casefold()} (version-control metadata), "
                    "which is never written"
                )
        self.pending.extend(reversed(names))

    def _enter(self, name: str) -> bool:
        try:
            fd = os.open(name, _ENTER, dir_fd=self.fd)
        except OSError as exc:
            if exc.errno not in _CHANGED:
                raise
            self._retry(name)
            return False
        self._leave()
        self.fd = fd
        self.parts.append(name)
        self.ids.append(_identity(os.fstat(fd)))
        return True

    def _up(self) -> None:
        """`..`: back to the directory the walk came through, checked; refused at the root."""
        if not self.parts:
            raise Outside(self.requested)
        parent = os.open("..", _ENTER, dir_fd=self.fd)
        expected = self.ids[-2] if len(self.ids) > 1 else self.root.identity
        if _identity(os.fstat(parent)) != expected:
            os.close(parent)
            raise FileToolError(f"{self.requested!r} was moved while being opened; try again")
        self._leave()
        self.parts.pop()
        self.ids.pop()
        if self.parts:
            self.fd = parent
        else:
            os.close(parent)

    def _mkdir(self, name: str) -> None:
        with contextlib.suppress(FileExistsError):  # made meanwhile: entered all the same
            os.mkdir(name, 0o777, dir_fd=self.fd)
        self._enter(name)  # if it was swapped already, the name is looked at again

    def _create(self, name: str) -> Opened | None:
        flags = self.flags | os.O_EXCL | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(name, flags, 0o666, dir_fd=self.fd)
        except FileExistsError:
            self._retry(name)  # appeared meanwhile (perhaps as a link): look again
            return None
        return _opened(fd, self._rel(name))

    def _open_file(self, name: str, st: os.stat_result) -> Opened | None:
        """The last component, not a directory: refused unless a regular file with one name,
        and then opened without following a link and without blocking, and checked again."""
        if not stat.S_ISREG(st.st_mode):
            raise not_regular(self.requested, st.st_mode)  # never opened
        if st.st_nlink > 1:
            raise HardLinked(self.requested, st.st_nlink)
        flags = (self.flags & ~os.O_CREAT) | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(name, flags, dir_fd=self.fd)
        except OSError as exc:
            if exc.errno not in _CHANGED:
                raise
            self._retry(name)
            return None
        opened = _opened(fd, self._rel(name))
        if not stat.S_ISREG(opened.st.st_mode):
            opened.close()
            raise not_regular(self.requested, opened.st.st_mode)
        if opened.st.st_nlink > 1:
            opened.close()
            raise HardLinked(self.requested, opened.st.st_nlink)
        return opened


def _opened(fd: int, rel: str) -> Opened:
    try:
        return Opened(fd, rel, os.fstat(fd))
    except BaseException:
        os.close(fd)
        raise
