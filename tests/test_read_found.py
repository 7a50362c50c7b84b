"""Read what the search found (issue 51, docs/adr/0068): a run that insists on evidence
(`Limits.first_turn_tool`) and has searched, found lines, and read no file, is asked for a tool
call on its next turn, its control naming the read of the file the search found most often.
Real file tools over a temporary folder; the model is scripted and records what it was sent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import keel
from keel._run.reading import LINES_BEFORE, LINES_READ, READ_FOUND_CONTROL, read_found_call
from keel.messages import ToolResult
from support import call, run_script

ANSWER = {"text": "`make_response` builds it."}


@pytest.fixture
def files(tmp_path: Path) -> list[keel.Tool]:
    body = "\n".join(f"x{n} = {n}" for n in range(1, 30))
    (tmp_path / "app.py").write_text(f"{body}\ndef make_response(rv):\n    return rv\n")
    (tmp_path / "notes.md").write_text("make_response is documented here.\n")
    return keel.file_tools(tmp_path)


def _result(name: str, content: str, error: bool = False) -> tuple[str, ToolResult]:
    return ("r1", ToolResult("c1", name, "k", content, is_error=error))


def test_the_read_named_is_the_file_found_most_often_around_its_first_line() -> None:
    found = "docs/a.rst:3: make_response\nsrc/app.py:40: def make_response\nsrc/app.py:90: x"
    named = read_found_call([_result("search_files", found)], {"read_file", "search_files"})
    assert named is not None
    name, _, arguments = named.partition(" ")
    start = 40 - LINES_BEFORE
    assert name == "read_file"
    assert json.loads(arguments) == {
        "path": "src/app.py",
        "start_line": start,
        "end_line": start + LINES_READ - 1,
    }


def test_nothing_is_named_after_a_read_without_matches_or_without_read_file() -> None:
    tools = {"read_file", "search_files"}
    search = _result("search_files", "app.py:3: x")
    assert read_found_call([search, _result("read_file", "1 x")], tools) is None
    assert read_found_call([_result("search_files", "no matches for 'x' under .")], tools) is None
    assert read_found_call([search], {"search_files"}) is None
    assert read_found_call([_result("search_files", "app.py:3: x", error=True)], tools) is None


async def test_after_a_search_that_found_lines_the_next_turn_reads_them(
    files: list[keel.Tool],
) -> None:
    script = {
        "turns": [
            call("search_files", pattern="make_response"),
            call("read_file", path="app.py", start_line=25, end_line=24 + LINES_READ),
            ANSWER,
        ]
    }
    out = await run_script(script, files, first_turn_tool=True)
    assert out.result.status == "completed"
    assert [r.tool_choice for r in out.requests] == ["required", "required", None]
    control = " ".join(out.requests[1].volatile)
    assert READ_FOUND_CONTROL in control
    end = 25 + LINES_READ - 1  # the def is line 30: LINES_BEFORE lines above it
    assert f'read_file {{"path": "app.py", "start_line": 25, "end_line": {end}}}' in control
    assert not any(READ_FOUND_CONTROL in " ".join(r.volatile) for r in out.requests[2:])


async def test_without_first_turn_tool_the_rule_is_off(files: list[keel.Tool]) -> None:
    script = {"turns": [call("search_files", pattern="make_response"), ANSWER]}
    out = await run_script(script, files)
    assert [r.tool_choice for r in out.requests] == [None, None]


async def test_a_synthesis_turn_wins_over_the_read(files: list[keel.Tool]) -> None:
    """Two model calls: the second is budget synthesis, even though nothing was read."""
    script = {"turns": [call("search_files", pattern="make_response")], "on_synthesis": ANSWER}
    out = await run_script(script, files, first_turn_tool=True, max_model_calls=2)
    assert out.result.synthesized == "budget"
    assert [r.tool_choice for r in out.requests] == ["required", "none"]
