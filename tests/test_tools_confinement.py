"""`--repo` confinement under attack: hard links, a directory swapped for a link out while the
tools run, link chains and `..` tricks. Every test plants a secret outside the repository and
checks it never comes back, and that nothing outside changes."""

from __future__ import annotations

import ctypes
import os
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from keel.tools.files import file_tools
from keel.tools.writes import write_tools

SECRET = "SECRET-outside-the-repo"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository, and beside it an `outside` directory holding a secret."""
    root = tmp_path / "repo"
    (root / "src").mkdir(parents=True)
    (root / "README.md").write_text("# Demo\n")
    (root / "src" / "main.py").write_text("print('inside')\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(f"{SECRET}\n")
    return root


def tools(root: Path) -> dict[str, Callable[..., str]]:
    """The real tool functions by name: list_files, read_file, search_files, write_file."""
    return {t.name: t.fn for t in file_tools(root) + write_tools(root)}


def attempt(fn: Callable[..., str], **arguments: Any) -> tuple[bool, str]:
    """(succeeded, text): the result, or the message of the error the tool raised."""
    try:
        return True, fn(**arguments)
    except Exception as exc:  # the executor turns any of these into an error result
        return False, f"{type(exc).__name__}: {exc}"


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


# -- hard links --------------------------------------------------------------------------------


def test_a_hardlink_to_an_outside_file_is_never_read(repo: Path) -> None:
    os.link(repo.parent / "outside" / "secret.txt", repo / "src" / "notes.txt")
    fns = tools(repo)
    read_ok, read = attempt(fns["read_file"], path="src/notes.txt")
    assert not read_ok and "hard link" in read and SECRET not in read, read
    found = fns["search_files"](pattern="SECRET")
    assert SECRET not in found and found.splitlines() == [
        "no matches for 'SECRET' under .",
        "[1 hard-linked file(s) not searched: a hard link may be a file outside the repository]",
    ]
    assert "src/notes.txt [hard link: not read]" in fns["list_files"](path="src").splitlines()


@pytest.mark.parametrize("append", [True, False])
def test_a_hardlink_to_an_outside_file_is_never_written(repo: Path, append: bool) -> None:
    outside = repo.parent / "outside"
    os.link(outside / "secret.txt", repo / "notes.txt")
    before = snapshot(outside)
    done, text = attempt(tools(repo)["write_file"], path="notes.txt", content="x\n", append=append)
    assert not done and "hard link" in text, text
    assert snapshot(outside) == before


# -- the swap race -----------------------------------------------------------------------------


def exchanger() -> Callable[[Path, Path], None]:
    """Atomically exchange two names (Linux `renameat2(RENAME_EXCHANGE)`), so `d` is always
    there, a directory or a link; skips the test where the C library lacks it."""
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        pytest.skip("renameat2 is not available to swap a directory and a link atomically")
    at_fdcwd, rename_exchange = -100, 2

    def exchange(a: Path, b: Path) -> None:
        if renameat2(at_fdcwd, bytes(a), at_fdcwd, bytes(b), rename_exchange) != 0:
            raise OSError(ctypes.get_errno(), "renameat2 failed")

    return exchange


class Swapper:
    """Swaps `repo/d` between a directory and a link to the outside directory, as fast as it
    can, in a background thread; leaves the directory in place when stopped."""

    def __init__(self, repo: Path) -> None:
        self.exchange = exchanger()
        self.real, self.link = repo / "d", repo / "d.link"
        os.symlink(repo.parent / "outside", self.link)
        self.stop = threading.Event()
        self.swaps = 0
        self.failure: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                self.exchange(self.real, self.link)
                self.exchange(self.real, self.link)
                self.swaps += 2
        except BaseException as exc:
            self.failure = exc

    def __enter__(self) -> Swapper:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)


@pytest.fixture
def swapped(repo: Path) -> Iterator[Swapper]:
    (repo / "d").mkdir()
    (repo / "d" / "f.txt").write_text("inside\n")
    (repo.parent / "outside" / "f.txt").write_text(f"{SECRET} in f\n")
    (repo.parent / "outside" / "only-outside.txt").write_text(f"{SECRET}\n")
    with Swapper(repo) as swapper:
        yield swapper


def test_swapping_a_directory_for_a_link_out_never_reaches_outside(
    repo: Path, swapped: Swapper
) -> None:
    """Thousands of reads, listings, searches, appends and writes through the real tools while
    `d` flips between a directory and a link out: zero outside reads, zero outside writes."""
    outside = repo.parent / "outside"
    before = snapshot(outside)
    fns = tools(repo)
    calls: list[tuple[str, dict[str, Any]]] = [
        ("read_file", {"path": "d/f.txt"}),
        ("list_files", {"path": "d"}),
        ("search_files", {"pattern": "SECRET|inside", "path": "d"}),
        ("write_file", {"path": "d/f.txt", "content": "a\n", "append": True}),
        ("write_file", {"path": "d/f.txt", "content": "inside\n"}),
        ("write_file", {"path": "d/made.txt", "content": "made\n"}),
    ]
    leaked: list[str] = []
    succeeded: Counter[str] = Counter()
    refused_outside = 0
    for _ in range(2500):
        for name, arguments in calls:
            done, text = attempt(fns[name], **arguments)
            succeeded[name] += done
            refused_outside += "outside the repository" in text
            if SECRET in text or "only-outside" in text:
                leaked.append(f"{name}: {text[:120]}")
    swapped.__exit__()
    written = {k: v for k, v in snapshot(outside).items() if before.get(k) != v}
    assert swapped.failure is None and swapped.swaps > 1000, (swapped.failure, swapped.swaps)
    assert (repo / "d").is_dir() and not (repo / "d").is_symlink()
    # Not vacuous: every tool got through while `d` was the directory, and calls met the link.
    assert set(succeeded) == set(fns) and min(succeeded.values()) > 0, succeeded
    assert refused_outside > 0
    assert (len(leaked), sorted(written)) == (0, []), leaked[:5]


# -- links and `..` --------------------------------------------------------------------------


def test_a_chain_of_links_inside_the_repository_is_followed(repo: Path) -> None:
    os.symlink("../README.md", repo / "src" / "one")
    os.symlink("one", repo / "src" / "two")
    os.symlink(repo / "src" / "two", repo / "three")  # absolute, into the repository
    os.symlink("src", repo / "srclink")
    fns = tools(repo)
    assert fns["read_file"](path="three").startswith("README.md: lines 1-1 of 1")
    assert fns["read_file"](path="srclink/two").startswith("README.md:")
    fns["write_file"](path="srclink/two", content="# Rewritten\n")
    assert (repo / "README.md").read_text() == "# Rewritten\n"
    assert (repo / "src" / "two").is_symlink()


def test_a_chain_of_links_whose_last_hop_leads_outside_is_refused(repo: Path) -> None:
    os.symlink("../../outside/secret.txt", repo / "src" / "hop2")
    os.symlink("src/hop2", repo / "hop1")
    fns = tools(repo)
    for name, arguments in [
        ("read_file", {"path": "hop1"}),
        ("write_file", {"path": "hop1", "content": "x", "append": True}),
    ]:
        done, text = attempt(fns[name], **arguments)
        assert not done and "outside the repository" in text and SECRET not in text, text
    assert (repo.parent / "outside" / "secret.txt").read_text() == f"{SECRET}\n"


def test_a_link_loop_is_a_clear_error(repo: Path) -> None:
    os.symlink("b", repo / "a")
    os.symlink("a", repo / "b")
    done, text = attempt(tools(repo)["read_file"], path="a")
    assert not done and "too many" in text and "links" in text, text


@pytest.mark.parametrize(
    "path",
    [
        "../outside/secret.txt",
        "src/../../outside/secret.txt",
        "./src/./../../outside/secret.txt",
        "up/outside/secret.txt",  # up -> ..
        "src/deep/../../../outside/secret.txt",
        "abs/secret.txt",  # abs -> <repo>/../outside, absolute and lexically below the root
        "proc/secret.txt",  # proc -> /proc/self/cwd/../outside: a magic link never followed
    ],
)
def test_dot_dot_tricks_never_leave_the_repository(repo: Path, path: str) -> None:
    (repo / "src" / "deep").mkdir()
    os.symlink("..", repo / "up")
    os.symlink(f"{repo}/../outside", repo / "abs")
    os.symlink("/proc/self/root" + str(repo.parent / "outside"), repo / "proc")
    fns = tools(repo)
    before = snapshot(repo.parent / "outside")
    for name, arguments in [
        ("read_file", {"path": path}),
        ("list_files", {"path": str(Path(path).parent)}),
        ("search_files", {"pattern": "SECRET", "path": str(Path(path).parent)}),
        ("write_file", {"path": path, "content": "x", "append": True}),
    ]:
        done, text = attempt(fns[name], **arguments)
        assert not done and "outside the repository" in text and SECRET not in text, (name, text)
    assert snapshot(repo.parent / "outside") == before


def test_dot_dot_that_stays_inside_is_fine(repo: Path) -> None:
    os.symlink("..", repo / "src" / "up")
    fns = tools(repo)
    assert fns["read_file"](path="src/../README.md").startswith("README.md:")
    assert fns["read_file"](path="src/up/README.md").startswith("README.md:")
    assert fns["read_file"](path="src/up/src/up/src/main.py").startswith("src/main.py:")


def test_walks_never_descend_through_links_even_inside(repo: Path) -> None:
    os.symlink("..", repo / "src" / "up")  # a loop a walk must not follow
    os.symlink(repo.parent / "outside", repo / "src" / "out")
    found = tools(repo)["search_files"](pattern="inside|SECRET")
    lines = [line for line in found.splitlines() if not line.startswith("[")]  # not the notes
    assert lines == ["src/main.py:1: print('inside')"]


def test_a_directory_moved_out_mid_walk_never_leads_outside(repo: Path) -> None:
    """`..` from a directory moved outside meanwhile must not climb into its new parent."""
    outside = repo.parent / "outside"
    (repo / "a" / "b").mkdir(parents=True)
    (repo / "a" / "note.txt").write_text("inside\n")
    stop = threading.Event()

    def move_back_and_forth() -> None:
        while not stop.is_set():
            os.rename(repo / "a" / "b", outside / "b")
            os.rename(outside / "b", repo / "a" / "b")

    mover = threading.Thread(target=move_back_and_forth, daemon=True)
    mover.start()
    read_file = tools(repo)["read_file"]
    results = [attempt(read_file, path="a/b/../secret.txt") for _ in range(3000)]
    stop.set()
    mover.join(10)
    assert [text for _, text in results if SECRET in text] == []


# -- writes ------------------------------------------------------------------------------------


def test_writes_make_folders_and_follow_links_that_stay_inside(repo: Path) -> None:
    os.symlink("src", repo / "code")
    os.symlink("src/fresh.txt", repo / "dangling")
    write_file = tools(repo)["write_file"]
    for path, content, reported in [
        ("new/deeper/file.txt", "x", "new/deeper/file.txt"),
        ("code/made.py", "y", "src/made.py"),
        ("dangling", "z", "src/fresh.txt"),
    ]:
        assert write_file(path=path, content=content) == f"wrote 1 characters to {reported}"
        assert (repo / reported).read_text() == content
    assert (repo / "dangling").is_symlink()


def test_a_dangling_link_out_is_never_created(repo: Path) -> None:
    outside = repo.parent / "outside"
    os.symlink(outside / "planted.txt", repo / "plant")
    os.symlink(outside / "newdir", repo / "plantdir")
    fns = tools(repo)
    for path in ("plant", "plantdir/x.txt"):
        done, text = attempt(fns["write_file"], path=path, content="x")
        assert not done and "outside the repository" in text, text
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]


@pytest.mark.parametrize("path", [".hg/hgrc", ".svn/entries", "meta/config", "sub/.Hg/x"])
def test_write_file_never_writes_vcs_metadata_even_through_a_link(repo: Path, path: str) -> None:
    for name in (".git", ".hg", ".svn"):
        (repo / name).mkdir()
    os.symlink(".git", repo / "meta")
    done, text = attempt(tools(repo)["write_file"], path=path, content="x")
    assert not done and "version-control metadata" in text, text
    assert not (repo / ".git" / "config").exists() and not (repo / "sub").exists()


# -- walks ---------------------------------------------------------------------------------------


def test_a_walk_stops_at_the_depth_limit_and_says_so(repo: Path) -> None:
    from keel.tools.confine import MAX_WALK_DEPTH

    deep = repo / "deep"
    fd = os.open(repo, os.O_RDONLY)
    try:
        os.mkdir("deep", dir_fd=fd)
        current = os.open("deep", os.O_RDONLY, dir_fd=fd)
        for _ in range(MAX_WALK_DEPTH + 2):
            os.mkdir("d", dir_fd=current)
            below = os.open("d", os.O_RDONLY, dir_fd=current)
            os.close(current)
            current = below
        with open(os.open("bottom.txt", os.O_WRONLY | os.O_CREAT, dir_fd=current), "w") as f:
            f.write("needle\n")
        os.close(current)
    finally:
        os.close(fd)
    found = tools(repo)["search_files"](pattern="needle", path=deep.name)
    assert found.splitlines() == [
        "no matches for 'needle' under deep",
        f"[1 folder(s) nested more than {MAX_WALK_DEPTH} deep not searched]",
    ]


# -- "/" as the repository root ----------------------------------------------------------------


def test_a_read_of_a_path_with_a_leading_slash_reads_below_the_root(repo: Path) -> None:
    """Small models write "/src/main.py" for the repository's src/main.py (the local model's
    first call for the README question was list_files "/keel/loop.py"): reads take "/" as the
    root, so an absolute path outside the root names a path below it, never the outside file."""
    fns = tools(repo)
    assert "print('inside')" in fns["read_file"](path="/src/main.py")
    assert fns["list_files"](path="/") == fns["list_files"](path=".")
    outside_secret = str(repo.parent / "outside" / "secret.txt")
    for fn, args in (
        (fns["read_file"], {"path": outside_secret}),
        (fns["list_files"], {"path": str(repo.parent / "outside")}),
        (fns["search_files"], {"pattern": "SECRET", "path": outside_secret}),
    ):
        ok, text = attempt(fn, **args)
        assert not ok and "no such" in text and SECRET not in text
    assert SECRET not in fns["search_files"](pattern="SECRET", path="/")


def test_a_write_to_an_absolute_path_outside_the_root_is_still_refused(repo: Path) -> None:
    """The approver sees the path that is written: "/notes.md" is not quietly repo/notes.md."""
    ok, text = attempt(tools(repo)["write_file"], path="/notes.md", content="x")
    assert not ok and "is outside the repository" in text
    assert not (repo / "notes.md").exists()
