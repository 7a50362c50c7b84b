"""Issue 45: the file tools skip what the repository ignores (its `.gitignore` files, matched as
git matches them) and the folders that are virtual environments, caches or dependencies by
their markers, even with no `.gitignore`; a search or a listing says what it skipped and how to
read it anyway, and a path named explicitly still reads.

After `make run`, `.venv` sits inside the repository: the newcomer's three questions were
answered from numpy and anthropic files in site-packages."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from keel.messages import ToolCall
from keel.tools.executor import ToolExecutor
from keel.tools.files import file_tools


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """`src/` and a virtual environment `.venv` (no .gitignore names it) that both hold the
    word, as a repository looks after `make run`."""
    root = tmp_path / "repo"
    (root / "src" / "keel").mkdir(parents=True)
    (root / "src" / "keel" / "loop.py").write_text("def run_loop():\n    return 'lease'\n")
    site = root / ".venv" / "lib" / "python3.11" / "site-packages" / "numpy"
    site.mkdir(parents=True)
    (root / ".venv" / "pyvenv.cfg").write_text("home = /usr/bin\nversion = 3.11.7\n")
    (site / "core.py").write_text("def run_loop():\n    return 'numpy'\n")
    return root


async def ok(root: Path, name: str, **arguments: Any) -> str:
    executor = ToolExecutor(file_tools(root))
    (executed,) = await executor.run_batch([ToolCall.from_arguments("f1", name, arguments)])
    assert not executed.result.is_error, executed.result.content
    return executed.result.content


def matched_paths(result: str) -> set[str]:
    return {line.split(":", 1)[0] for line in result.splitlines() if ":" in line[:80]
            and not line.startswith("[")}  # fmt: skip


async def test_a_search_answers_from_src_not_from_a_virtual_environment(repo: Path) -> None:
    result = await ok(repo, "search_files", pattern="def run_loop")
    assert matched_paths(result) == {"src/keel/loop.py"}, result
    assert ".venv" in result and "virtual environment" in result  # says what it skipped
    assert 'search_files {"pattern": "def run_loop", "path": ".venv"}' in result  # and how


async def test_a_gitignored_build_folder_is_skipped_too(repo: Path) -> None:
    (repo / ".gitignore").write_text("# build output\n/build/\n*.log\n!keep.log\n")
    (repo / "build" / "lib").mkdir(parents=True)
    (repo / "build" / "lib" / "loop.py").write_text("def run_loop():\n    return 'copy'\n")
    (repo / "debug.log").write_text("def run_loop() was called\n")
    (repo / "keep.log").write_text("def run_loop() is kept\n")
    result = await ok(repo, "search_files", pattern="def run_loop")
    assert matched_paths(result) == {"src/keel/loop.py", "keep.log"}, result
    assert "build" in result and ".gitignore" in result


async def test_a_nested_gitignore_applies_below_its_folder(repo: Path) -> None:
    (repo / "src" / ".gitignore").write_text("generated_*.py\n")
    (repo / "src" / "generated_loop.py").write_text("def run_loop():\n    return 'made'\n")
    (repo / "generated_top.py").write_text("def run_loop():\n    return 'top'\n")
    result = await ok(repo, "search_files", pattern="def run_loop")
    assert matched_paths(result) == {"src/keel/loop.py", "generated_top.py"}, result


@pytest.mark.parametrize("marker", ["__pycache__", "node_modules"])
async def test_caches_and_dependencies_are_skipped_by_their_names(repo: Path, marker: str) -> None:
    (repo / "web" / marker).mkdir(parents=True)
    (repo / "web" / marker / "loop.js").write_text("def run_loop\n")
    result = await ok(repo, "search_files", pattern="def run_loop")
    assert matched_paths(result) == {"src/keel/loop.py"}, result


async def test_a_listing_leaves_ignored_folders_out_and_says_how_to_list_them(
    repo: Path,
) -> None:
    result = await ok(repo, "list_files", path=".")
    assert "src/" in result.splitlines()
    assert ".venv/" not in result.splitlines()
    assert 'list_files {"path": ".venv"}' in result, result


async def test_an_explicit_path_under_an_ignored_folder_still_reads(repo: Path) -> None:
    site = ".venv/lib/python3.11/site-packages/numpy"
    read = await ok(repo, "read_file", path=f"{site}/core.py")
    assert "return 'numpy'" in read
    searched = await ok(repo, "search_files", pattern="def run_loop", path=".venv")
    assert matched_paths(searched) == {f"{site}/core.py"}, searched
    listed = await ok(repo, "list_files", path=site)
    assert f"{site}/core.py" in listed.splitlines()


def test_keel_show_says_what_a_search_skipped(repo: Path, tmp_path: Path) -> None:
    """`keel show` prints a result's first line; what the walk left out is at its end."""
    from typer.testing import CliRunner

    import keel
    from keel.cli.app import app

    search = {"name": "search_files", "arguments": {"pattern": "def run_loop"}}
    turns = [{"tool_calls": [search]}, {"text": "In src/keel/loop.py."}]
    model = keel.ScriptedTransport.from_dict({"turns": turns})
    store = tmp_path / "runs.sqlite"
    with keel.Agent(model, tools=file_tools(repo), store=store) as agent:
        run_id = agent.run("Where is run_loop?").run_id
    shown = CliRunner().invoke(
        app, ["show", run_id, "--store", str(store)], env={"COLUMNS": "300"}
    )
    assert shown.exit_code == 0, shown.stderr
    assert "skipped: .venv (a virtual environment)" in shown.stdout, shown.stdout
