"""File tools: list, read and search inside the root, and never one step outside it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from keel.errors import ConfigError
from keel.messages import ToolCall
from keel.tools.base import Effect
from keel.tools.executor import ExecutedCall, ToolExecutor
from keel.tools.files import MAX_SEARCH_MATCHES, file_tools
from keel.tools.guidance import END_OF_FILE


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A small repository beside a directory the tools must never see."""
    root = tmp_path / "repo"
    (root / "src" / "pkg").mkdir(parents=True)
    (root / ".git").mkdir()
    (root / ".git" / "config").write_text("secret_token = 1\n")
    (root / "README.md").write_text("# Demo\nThis is the demo repo.\n")
    (root / "src" / "pkg" / "core.py").write_text(
        "def alpha():\n    return 1\n\n\ndef beta():\n    return alpha() + 1\n"
    )
    (root / "src" / "notes.txt").write_text("alpha is first\nbeta is second\n")
    (root / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("def alpha(): leaked\n")
    return root


async def use(root: Path, name: str, **arguments: Any) -> ExecutedCall:
    executor = ToolExecutor(file_tools(root))
    (executed,) = await executor.run_batch([ToolCall.from_arguments("f1", name, arguments)])
    return executed


async def ok(root: Path, name: str, **arguments: Any) -> str:
    executed = await use(root, name, **arguments)
    assert not executed.result.is_error, executed.result.content
    return executed.result.content


async def refused(root: Path, name: str, **arguments: Any) -> str:
    executed = await use(root, name, **arguments)
    assert executed.result.is_error, executed.result.content
    return executed.result.content


def test_file_tools_are_read_only_and_a_missing_root_is_a_config_error(tmp_path: Path) -> None:
    tools = file_tools(tmp_path)
    assert [t.name for t in tools] == ["list_files", "read_file", "search_files"]
    assert all(t.effect is Effect.READ_ONLY for t in tools)
    with pytest.raises(ConfigError):
        file_tools(tmp_path / "nope")


# -- listing ------------------------------------------------------------------------------


async def test_listing_is_sorted_marks_directories_and_skips_git(repo: Path) -> None:
    assert await ok(repo, "list_files") == "README.md\nlogo.png\nsrc/"
    assert await ok(repo, "list_files", path="src") == "src/notes.txt\nsrc/pkg/"


async def test_listing_a_missing_directory_is_an_error(repo: Path) -> None:
    assert "no such directory" in await refused(repo, "list_files", path="nope")


# -- reading ------------------------------------------------------------------------------


async def test_read_file_numbers_every_line(repo: Path) -> None:
    text = await ok(repo, "read_file", path="src/pkg/core.py")
    lines = text.splitlines()
    assert lines[0] == "src/pkg/core.py: lines 1-6 of 6 (" + END_OF_FILE + ")"
    assert lines[1] == "     1\tdef alpha():"
    assert lines[6] == "     6\t    return alpha() + 1"


async def test_read_file_line_ranges_are_one_based_and_inclusive(repo: Path) -> None:
    text = await ok(repo, "read_file", path="src/pkg/core.py", start_line=5, end_line=6)
    assert text.splitlines() == [
        "src/pkg/core.py: lines 5-6 of 6 (" + END_OF_FILE + ")",
        "     5\tdef beta():",
        "     6\t    return alpha() + 1",
    ]
    clamped = await ok(repo, "read_file", path="src/pkg/core.py", start_line=6, end_line=99)
    assert clamped.splitlines()[1:] == ["     6\t    return alpha() + 1"]


@pytest.mark.parametrize(
    ("start", "end", "message"),
    [(0, None, "start_line must be 1 or more"), (4, 2, "before start_line")],
)
async def test_bad_line_ranges_are_clear_errors(
    repo: Path, start: int, end: int | None, message: str
) -> None:
    text = await refused(repo, "read_file", path="src/pkg/core.py", start_line=start, end_line=end)
    assert message in text


async def test_long_files_are_read_in_pages(repo: Path) -> None:
    (repo / "long.txt").write_text("".join(f"row {i}\n" for i in range(1, 2501)))
    first = await ok(repo, "read_file", path="long.txt")
    assert "lines 1-2000 of 2500" in first
    assert 'read_file {"path": "long.txt", "start_line": 2001}' in first
    assert "row 2000" in first and "row 2001" not in first
    rest = await ok(repo, "read_file", path="long.txt", start_line=2001)
    assert "lines 2001-2500 of 2500" in rest and "more remains" not in rest


async def test_binary_missing_and_directory_reads_are_clear_errors(repo: Path) -> None:
    assert "binary file" in await refused(repo, "read_file", path="logo.png")
    assert "no such file" in await refused(repo, "read_file", path="missing.py")
    assert "is a directory" in await refused(repo, "read_file", path="src")


async def test_empty_files_say_so(repo: Path) -> None:
    (repo / "empty.txt").write_text("")
    assert "(empty file)" in await ok(repo, "read_file", path="empty.txt")


# -- searching ----------------------------------------------------------------------------


async def test_search_prints_relative_path_line_and_text(repo: Path) -> None:
    text = await ok(repo, "search_files", pattern=r"def \w+\(")
    assert text.splitlines() == [
        "src/pkg/core.py:1: def alpha():",
        "src/pkg/core.py:5: def beta():",
        "[the search is complete: these are all 2 matching lines in the repository; the same "
        "search again finds the same lines]",
    ]


async def test_search_skips_git_and_binary_files_and_respects_path(repo: Path) -> None:
    assert "no matches" in await ok(repo, "search_files", pattern="secret_token")
    assert "no matches" in await ok(repo, "search_files", pattern="IHDR")
    scoped = await ok(repo, "search_files", pattern="alpha", path="src/notes.txt")
    assert scoped.splitlines()[0] == "src/notes.txt:1: alpha is first"
    assert len(scoped.splitlines()) == 3  # the next (last) line, and that it is complete


async def test_search_skips_files_over_two_megabytes(repo: Path) -> None:
    (repo / "huge.log").write_text("needle\n" + "x" * 2_100_000)
    assert "no matches" in await ok(repo, "search_files", pattern="needle")


async def test_an_invalid_regex_is_a_clear_error(repo: Path) -> None:
    text = await refused(repo, "search_files", pattern="def (alpha")
    assert "invalid regular expression" in text and "'def (alpha'" in text


async def test_search_stops_at_the_match_cap_and_says_so(repo: Path) -> None:
    (repo / "many.txt").write_text("hit\n" * (MAX_SEARCH_MATCHES + 50))
    lines = (await ok(repo, "search_files", pattern="^hit$")).splitlines()
    assert len(lines) == MAX_SEARCH_MATCHES + 1
    assert lines[-1].startswith(f"[stopped at {MAX_SEARCH_MATCHES} matches")


# -- staying inside the root --------------------------------------------------------------


@pytest.mark.parametrize("name", ["list_files", "read_file", "search_files"])
async def test_dot_dot_traversal_is_refused(repo: Path, name: str) -> None:
    extra = {"pattern": "alpha"} if name == "search_files" else {}
    path = "../outside/secret.txt" if name == "read_file" else "../outside"
    text = await refused(repo, name, path=path, **extra)
    assert "outside the repository" in text and "leaked" not in text


async def test_absolute_paths_outside_name_paths_below_the_root(repo: Path) -> None:
    secret = repo.parent / "outside" / "secret.txt"
    assert "no such file" in await refused(repo, "read_file", path=str(secret))
    assert await ok(repo, "list_files", path="/") == await ok(repo, "list_files", path=".")


async def test_absolute_paths_inside_are_accepted(repo: Path) -> None:
    text = await ok(repo, "read_file", path=str(repo / "README.md"))
    assert text.startswith("README.md: lines 1-2 of 2")


async def test_a_symlink_pointing_outside_is_refused_when_read(repo: Path) -> None:
    os.symlink(repo.parent / "outside" / "secret.txt", repo / "link.txt")
    os.symlink(repo.parent / "outside", repo / "linkdir")
    assert "outside the repository" in await refused(repo, "read_file", path="link.txt")
    assert "outside the repository" in await refused(repo, "list_files", path="linkdir")
    text = await refused(repo, "read_file", path="linkdir/secret.txt")
    assert "outside the repository" in text and "leaked" not in text


async def test_walks_never_follow_symlinks_leading_outside(repo: Path) -> None:
    os.symlink(repo.parent / "outside" / "secret.txt", repo / "src" / "link.py")
    os.symlink(repo.parent / "outside", repo / "src" / "linkdir")
    found = await ok(repo, "search_files", pattern="alpha")
    assert "leaked" not in found and "link" not in found
    assert "src/pkg/core.py:1: def alpha():" in found
    listed = await ok(repo, "list_files", path="src")
    assert listed.splitlines() == [
        "src/notes.txt",
        "src/pkg/",
        "[skipped 2 link(s) leading outside the repository]",
    ]


async def test_symlinks_within_the_root_are_fine(repo: Path) -> None:
    os.symlink(repo / "README.md", repo / "src" / "readme-link.md")
    text = await ok(repo, "read_file", path="src/readme-link.md")
    assert "This is the demo repo." in text
    assert "src/readme-link.md" in await ok(repo, "list_files", path="src")


def test_list_files_of_a_file_names_the_file_as_ls_does(repo: Path) -> None:
    """The local model lists a file it means to read; the answer says what it is and how to read
    it, instead of an error the model repeats."""
    listing = {t.name: t.fn for t in file_tools(repo)}["list_files"]
    size = os.stat(repo / "README.md").st_size
    assert listing(path="README.md") == (
        f'README.md ({size} bytes) is a file: read it with read_file {{"path": "README.md"}}'
    )


def test_file_tool_paths_are_described_to_the_model(repo: Path) -> None:
    """`Annotated[str, Field(description=...)]` reaches the JSON Schema the model reads."""
    for tool in file_tools(repo):
        described = tool.parameters["properties"]["path"].get("description", "")
        assert "path relative to the repository root" in described, tool.name
