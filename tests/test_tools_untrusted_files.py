"""File tools against hostile input: catastrophic patterns, special files, huge files."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from isolated import run_python
from keel.messages import ToolCall
from keel.tools import files
from keel.tools.executor import ExecutedCall, ToolExecutor
from keel.tools.files import file_tools
from keel.tools.writes import write_tools


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    (root / "notes.txt").write_text("alpha\nbeta\n")
    return root


async def use(root: Path, name: str, timeout: float = 30.0, **arguments: Any) -> ExecutedCall:
    tools = [dataclasses.replace(t, timeout=timeout) for t in file_tools(root) + write_tools(root)]
    executor = ToolExecutor(tools)
    (executed,) = await executor.run_batch([ToolCall.from_arguments("f1", name, arguments)])
    return executed


def tool_fn(root: Path, name: str) -> Any:
    return next(t.fn for t in file_tools(root) if t.name == name)


# -- untrusted patterns ------------------------------------------------------------------------


def test_a_catastrophic_pattern_returns_within_seconds(repo: Path) -> None:
    (repo / "crafted.txt").write_text(("a" * 40 + "\n") * 20)
    proc = run_python(
        f"""
        import asyncio, time
        from keel.messages import ToolCall
        from keel.tools.executor import ToolExecutor
        from keel.tools.files import file_tools

        async def main() -> None:
            executor = ToolExecutor(file_tools({str(repo)!r}))
            search = ToolCall.from_arguments("c", "search_files", {{"pattern": "(a+)+b"}})
            started = time.monotonic()
            (done,) = await executor.run_batch([search])
            print(round(time.monotonic() - started, 3))
            print(done.result.content)

        asyncio.run(main())
        """,
        timeout=20,
    )
    assert proc.returncode == 0, proc.stderr
    seconds, content = proc.stdout.split("\n", 1)
    assert float(seconds) < 2.0 and "no matches" in content


async def test_patterns_needing_backtracking_are_refused_with_a_clear_error(repo: Path) -> None:
    executed = await use(repo, "search_files", pattern=r"(alpha)\1")
    assert executed.result.is_error and "invalid regular expression" in executed.result.content
    assert "RE2" in executed.result.content


async def test_search_matches_line_by_line_with_python_like_syntax(repo: Path) -> None:
    (repo / "code.py").write_text("def alpha():\r\n    return 1\n\ndef beta(): pass\n")
    executed = await use(repo, "search_files", pattern=r"(?i)^DEF \w+\(\)", path="code.py")
    assert executed.result.content.splitlines() == [
        "code.py:1: def alpha():",
        "code.py:4: def beta(): pass",
        "[the search is complete: these are all 2 matching lines in code.py; the same search "
        "again finds the same lines]",
    ]
    across = await use(repo, "search_files", pattern=r"alpha\s+beta")
    assert "no matches" in across.result.content  # a match never spans two lines


async def test_search_stops_at_the_total_byte_budget_and_says_so(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(files, "MAX_SEARCH_TOTAL_BYTES", 1000)
    for i in range(5):
        (repo / f"part{i}.txt").write_text("needle\n" + "hay\n" * 100)
    content = (await use(repo, "search_files", pattern="needle")).result.content
    assert "part0.txt:1: needle" in content and "part4.txt" not in content
    assert "stopped after searching" in content


# -- special files ---------------------------------------------------------------------------


def make_fifo(path: Path, seconds: float = 8.0) -> Path:
    """A FIFO, plus a thread that keeps opening its other end for a while: code that wrongly
    opens it and blocks is let through, so a failing test fails instead of hanging."""
    os.mkfifo(path)
    until = time.monotonic() + seconds

    def keep_releasing() -> None:
        while time.monotonic() < until:
            for flags in (os.O_WRONLY | os.O_NONBLOCK, os.O_RDONLY | os.O_NONBLOCK):
                with contextlib.suppress(OSError):
                    os.close(os.open(path, flags))
            time.sleep(0.02)

    threading.Thread(target=keep_releasing, daemon=True).start()
    return path


@pytest.mark.parametrize(
    ("name", "arguments"),
    [
        ("read_file", {"path": "pipe"}),
        ("write_file", {"path": "pipe", "content": "x"}),
        ("search_files", {"path": "pipe", "pattern": "x"}),
        ("list_files", {"path": "pipe"}),
    ],
)
async def test_special_files_are_refused_before_they_are_opened(
    repo: Path, name: str, arguments: dict[str, Any]
) -> None:
    make_fifo(repo / "pipe")
    executed = await use(repo, name, timeout=2.0, **arguments)
    assert executed.result.is_error and not executed.timed_out, executed.result.content
    assert "not a regular file" in executed.result.content and "FIFO" in executed.result.content


async def test_walks_skip_special_files_and_listings_mark_them(repo: Path) -> None:
    make_fifo(repo / "pipe")
    found = await use(repo, "search_files", timeout=2.0, pattern="alpha")
    listed = await use(repo, "list_files", timeout=2.0)
    assert found.result.content.splitlines()[0] == "notes.txt:1: alpha"
    assert "pipe [FIFO: not a regular file]" in listed.result.content.splitlines()


# -- huge files -------------------------------------------------------------------------------


def test_reading_a_huge_single_line_file_is_bounded_in_memory(repo: Path) -> None:
    size = 20_000_000
    with (repo / "blob.txt").open("w") as handle:
        for _ in range(size // 1_000_000):
            handle.write("x" * 1_000_000)
    read_file = tool_fn(repo, "read_file")
    tracemalloc.start()
    try:
        started = time.monotonic()
        text = read_file(path="blob.txt")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4_000_000, f"peak {peak} bytes"
    assert time.monotonic() - started < 5
    assert len(text) < 100_000
    assert f"line 1 is cut: {size} bytes" in text


def test_read_file_stops_at_the_byte_budget_and_says_where_to_go_on(repo: Path) -> None:
    (repo / "wide.txt").write_text("".join(f"{i:06d}{'y' * 993}\n" for i in range(1, 2001)))
    text = tool_fn(repo, "read_file")(path="wide.txt")
    header = text.splitlines()[0]
    budget_lines = files.MAX_READ_BYTES // 1000
    assert f"lines 1-{budget_lines} of 2000" in header
    assert f'read_file {{"path": "wide.txt", "start_line": {budget_lines + 1}}}' in header
    assert len(text) < files.MAX_READ_BYTES + 20_000


# -- VCS metadata --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path", [".git/config", ".git/hooks/pre-commit", "sub/.git/HEAD", ".GIT/x"]
)
async def test_write_file_never_writes_vcs_metadata(repo: Path, path: str) -> None:
    (repo / ".git").mkdir()
    executed = await use(repo, "write_file", path=path, content="[core]\n")
    assert executed.result.is_error and ".git" in executed.result.content
    assert not (repo / path).exists()
