"""A read at or after a file's end answers in one unmistakable sentence (issue 26's last item,
issue 25): after reading src/keel/_run/loop.py to its end, the local model asked for
`start_line` 270 (its last line) three more times, each answered `lines 270-270 of 270 (the end
of the file: nothing more to read)`, and the run ended in a synthesis turn. A read that starts at
the last line, or past it, now says the file has been read and the answer is due; it is a
result, not an error (an error invites a retry)."""

from __future__ import annotations

from pathlib import Path

import pytest

import keel
from keel.messages import ToolCall
from keel.tools.executor import ToolExecutor
from keel.tools.files import LINES_AFTER_ONE_MATCH


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "loop.py").write_text("".join(f"line {n}\n" for n in range(1, 271)))
    return tmp_path


async def read(repo: Path, **arguments: object) -> tuple[str, bool]:
    executor = ToolExecutor(keel.file_tools(repo))
    call = ToolCall.from_arguments("c1", "read_file", {"path": "src/loop.py", **arguments})
    done = await executor.run_batch([call])
    return done[0].result.content, done[0].result.is_error


async def test_a_read_at_the_last_line_says_the_file_is_read_and_the_answer_is_due(
    repo: Path,
) -> None:
    text, error = await read(repo, start_line=270)
    header, *lines = text.split("\n")
    assert not error
    assert header == (
        "src/loop.py: line 270 is its last line; nothing follows it: you have read all of it: "
        "answer the question now, from what you read"
    )
    assert lines == ["   270\tline 270"]


async def test_a_read_past_the_end_answers_briefly_instead_of_an_error(repo: Path) -> None:
    text, error = await read(repo, start_line=300)
    assert not error
    assert text == (
        "line 300 is past the end of src/loop.py (270 lines); you have read all of it: "
        "answer the question now, from what you read"
    )


async def test_a_read_that_reaches_the_end_says_to_answer_from_it(repo: Path) -> None:
    text, _ = await read(repo, start_line=200)
    assert text.split("\n")[0] == (
        "src/loop.py: lines 200-270 of 270 (the end of the file: nothing more to read; answer "
        "the question from what you read)"
    )


async def test_a_read_cut_short_says_reading_on_is_for_when_the_question_needs_it(
    repo: Path,
) -> None:
    """The 0.5B model obeyed "read the next part with ..." as an order, read all of loop.py
    for a question its first 60 lines answer, and lost the imports in 5,000 tokens of code."""
    executor = ToolExecutor(keel.file_tools(repo), max_result_chars=1000)
    call = ToolCall.from_arguments("c1", "read_file", {"path": "src/loop.py"})
    text = (await executor.run_batch([call]))[0].result.content
    assert "; if the question needs it, read the next part with read_file " in text.split("\n")[0]


async def test_a_path_missing_its_first_folder_reads_the_one_file_it_means(repo: Path) -> None:
    """The local model asked for `/keel/_run/loop.py` four times when the question said
    `src/keel/_run/loop.py`, though each error named the right call: a missing path that
    exists once with one folder in front is read, and the result says which file it is."""
    executor = ToolExecutor(keel.file_tools(repo))
    call = ToolCall.from_arguments("c1", "read_file", {"path": "/loop.py", "end_line": 2})
    done = (await executor.run_batch([call]))[0].result
    header, note, *lines = done.content.split("\n")
    assert not done.is_error
    assert header == "src/loop.py: lines 1-2 of 270"
    assert note == "(there is no '/loop.py': this is src/loop.py, read instead)"
    assert lines == ["     1\tline 1", "     2\tline 2"]


async def test_a_path_that_exists_in_two_folders_is_not_guessed(repo: Path) -> None:
    (repo / "tests").mkdir()
    (repo / "tests" / "loop.py").write_text("test\n")
    executor = ToolExecutor(keel.file_tools(repo))
    call = ToolCall.from_arguments("c1", "read_file", {"path": "loop.py"})
    done = (await executor.run_batch([call]))[0].result
    assert done.is_error and "no such file: 'loop.py'" in done.content


async def search(repo: Path, pattern: str, path: str) -> str:
    executor = ToolExecutor(keel.file_tools(repo))
    call = ToolCall.from_arguments("c1", "search_files", {"pattern": pattern, "path": path})
    done = await executor.run_batch([call])
    assert not done[0].result.is_error
    return done[0].result.content


async def test_a_complete_search_says_it_found_every_match_and_a_repeat_finds_the_same(
    repo: Path,
) -> None:
    """Issue 26, measured on the local model: given the import lines of loop.py by a search, it
    sent the same search four more times; the result never said it was the whole answer."""
    text = await search(repo, "^line 1[0-2]$", "src/loop.py")
    *matches, last = text.split("\n")
    assert matches == [f"src/loop.py:{n}: line {n}" for n in (10, 11, 12)]
    assert last == (
        "[the search is complete: these are all 3 matching lines in src/loop.py; the same "
        "search again finds the same lines]"
    )


async def test_a_search_stopped_short_does_not_say_it_is_complete(repo: Path) -> None:
    text = await search(repo, "^line", "src")
    assert "complete" not in text and "stopped at 200 matches" in text


async def test_a_search_that_finds_one_line_shows_what_follows_it(repo: Path) -> None:
    """Issue 25: asked for `decide_mode`'s parameters, the local model read the whole module
    four times, cut before the function each time; steered to a search for its `def` line, it
    got that line alone and sent the same search again. A search that finds one line shows the
    twelve after it, as they are in the file (with ``grep -A``'s ``path-N-`` prefixes the model
    copied the prefixes and lost the names). No call to read on is named: the model copied such
    a note into its answer instead of the parameters."""
    text = await search(repo, "^line 11$", "src/loop.py")
    lines = text.split("\n")
    assert lines[0] == "src/loop.py:11: line 11"
    assert lines[1 : 1 + LINES_AFTER_ONE_MATCH] == [
        f"line {n}" for n in range(12, 12 + LINES_AFTER_ONE_MATCH)
    ]
    assert lines[1 + LINES_AFTER_ONE_MATCH :] == [
        "[the search is complete: these are all 1 matching line in src/loop.py; the same "
        "search again finds the same lines]",
    ]
    several = await search(repo, "^line 1[0-2]$", "src/loop.py")
    assert "line 13" not in several


async def test_the_lines_after_one_match_stop_at_the_end_of_the_file(repo: Path) -> None:
    (repo / "short.py").write_text("def f(\n    a: int,\n) -> None: ...\n")
    text = await search(repo, "^def f", "short.py")
    assert text.split("\n")[:3] == [
        "short.py:1: def f(", "    a: int,", ") -> None: ..."
    ]
    assert text.split("\n")[3].startswith("[the search is complete")


async def test_an_empty_last_line_is_shown_among_the_lines_after_one_match(repo: Path) -> None:
    """A file whose last line is empty: when the twelve lines after the match end on it, it is
    one of them (it was taken for the nothing after the file's final newline)."""
    lines = [f"line {n}" for n in range(1, LINES_AFTER_ONE_MATCH + 1)]
    (repo / "tail.py").write_text("def f(\n" + "\n".join(lines[1:]) + "\n\n")
    text = await search(repo, "^def f", "tail.py")
    shown = text.split("\n")[1 : 1 + LINES_AFTER_ONE_MATCH]
    assert shown == [*lines[1:], ""]
    assert text.split("\n")[1 + LINES_AFTER_ONE_MATCH].startswith("[the search is complete")
