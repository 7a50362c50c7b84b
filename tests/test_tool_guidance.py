"""Tool results that tell the model how to go on (issue 26, ADR 0036): a read cut by the
run's result cap names the exact call that reads the next part, a missing or refused path says
what exists near it, and no tool description carries an example value a small model could take
for a real one (the local model called `list_files {"path": "/src/app/main.py"}`, the example
of the old `path` description, four times)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import keel
from keel.messages import ToolCall
from keel.tools.browser import browser_tools
from keel.tools.executor import ToolExecutor
from keel.tools.guidance import END_OF_FILE
from keel.tools.web import web_tools
from keel.tools.writes import write_tools

NEXT_READ = re.compile(r"read the next part with read_file (\{.*?\})\)")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    lines = "".join(f"line {n}: {'x' * (n % 50)}\n" for n in range(1, 401))
    (tmp_path / "src" / "pkg" / "loop.py").write_text(lines)
    (tmp_path / "src" / "pkg" / "step.py").write_text("step\n")
    (tmp_path / "README.md").write_text("readme\n")
    return tmp_path


async def call(executor: ToolExecutor, name: str, **arguments: object) -> str:
    done = await executor.run_batch([ToolCall.from_arguments("c1", name, dict(arguments))])
    return done[0].result.content


async def test_a_read_cut_by_the_result_cap_names_the_call_that_reads_the_next_part(
    repo: Path,
) -> None:
    """Following the named calls reads the whole file once, each line exactly once, and no
    shown part ends in the middle of a line."""
    executor = ToolExecutor(keel.file_tools(repo), max_result_chars=3000)
    arguments: dict[str, object] = {"path": "src/pkg/loop.py"}
    seen: list[int] = []
    for _ in range(50):
        text = await call(executor, "read_file", **arguments)
        header, *rows = text.split("\n")
        numbered = [r for r in rows if re.match(r"^\s*\d+\t", r)]
        seen += [int(r.split("\t")[0]) for r in numbered]
        assert all(r.startswith(f"{int(r.split(chr(9))[0]):>6}\tline ") for r in numbered)
        found = NEXT_READ.search(header)
        if found is None:
            assert "truncated" not in text
            break
        arguments = json.loads(found.group(1))
        assert arguments["path"] == "src/pkg/loop.py"
        assert header.startswith(f"src/pkg/loop.py: lines {numbered[0].split(chr(9))[0].strip()}-")
    assert seen == list(range(1, 401))
    assert header.endswith(f"of 400 ({END_OF_FILE})")


async def test_a_read_that_reaches_the_last_line_says_nothing_more_remains(repo: Path) -> None:
    """The local model read the last line of loop.py three more times: the header said only
    `lines 246-246 of 246`."""
    executor = ToolExecutor(keel.file_tools(repo))
    text = await call(executor, "read_file", path="src/pkg/loop.py", start_line=390)
    assert text.split("\n")[0] == f"src/pkg/loop.py: lines 390-400 of 400 ({END_OF_FILE})"
    middle = await call(executor, "read_file", path="src/pkg/loop.py", start_line=1, end_line=5)
    assert middle.split("\n")[0] == "src/pkg/loop.py: lines 1-5 of 400"


async def test_a_cut_read_with_an_end_line_keeps_it_in_the_next_call(repo: Path) -> None:
    executor = ToolExecutor(keel.file_tools(repo), max_result_chars=2000)
    text = await call(executor, "read_file", path="src/pkg/loop.py", start_line=10, end_line=300)
    found = NEXT_READ.search(text.split("\n")[0])
    assert found is not None
    following = json.loads(found.group(1))
    assert following["end_line"] == 300 and following["start_line"] > 10


async def test_a_missing_path_says_what_exists_nearby(repo: Path) -> None:
    executor = ToolExecutor(keel.file_tools(repo))
    text = await call(executor, "read_file", path="src/pkg/lop.py")
    assert "no such file: 'src/pkg/lop.py'" in text
    assert "The folder src/pkg exists and holds: loop.py, step.py." in text
    assert "Closest to 'lop.py': src/pkg/loop.py" in text
    listed = await call(executor, "list_files", path="/src/app/main.py")
    assert "The folder src exists and holds: pkg/." in listed
    searched = await call(executor, "search_files", pattern="x", path="scr")
    assert "top folder exists and holds: README.md, src/." in searched
    assert "Closest to 'scr': src." in searched


async def test_a_path_missing_its_first_folder_names_the_path_that_exists(repo: Path) -> None:
    """The local model asked for `list_files {"path": "/keel/_run/loop.py"}` four times (the
    repository's `src/` dropped); the answer now names the path one folder down (read_file
    reads that file itself: test_read_past_the_end.py)."""
    (repo / ".cache").mkdir()
    executor = ToolExecutor(keel.file_tools(repo))
    text = await call(executor, "list_files", path="/pkg/loop.py")
    assert text.endswith('It is: read_file {"path": "src/pkg/loop.py"}')
    listed_dir = await call(executor, "list_files", path="/pkg")
    assert listed_dir.endswith('It is: list_files {"path": "src/pkg"}')
    assert "holds: README.md, src/, .cache/." in text  # dot-folders last
    listed = await call(executor, "list_files", path="src/pkg/loop.py")
    assert 'is a file: read it with read_file {"path": "src/pkg/loop.py"}' in listed


async def test_a_refused_path_says_what_exists(repo: Path) -> None:
    executor = ToolExecutor(keel.file_tools(repo))
    text = await call(executor, "read_file", path="../outside.txt")
    assert "is outside the repository" in text
    assert "top folder exists and holds: README.md, src/." in text


def descriptions(tool: keel.Tool) -> list[str]:
    found = [tool.description]
    for schema in tool.parameters.get("properties", {}).values():
        found.append(str(schema.get("description", "")))
    return found


EXAMPLE_WORDS = re.compile(r"\b(such as|e\.g\.|for example|for instance)\b", re.I)
QUOTED_VALUE = re.compile(r'"([^"]*)"')


def test_tool_descriptions_carry_no_example_values(tmp_path: Path) -> None:
    """Descriptions say what form a value takes, never a sample of one: no "such as", no
    quoted path or URL (quoted punctuation, "." and "/", describes the form)."""
    tools = [*keel.file_tools(tmp_path), *write_tools(tmp_path), *web_tools(), *browser_tools()]
    for tool in tools:
        for text in descriptions(tool):
            assert not EXAMPLE_WORDS.search(text), (tool.name, text)
            for quoted in QUOTED_VALUE.findall(text):
                assert not re.search(r"\w[/.]\w|://", quoted), (tool.name, quoted)
