"""Issue 45: the answer stands on the screen at the end of `keel run` in a terminal, whatever
the model and whether it streamed, and progress lines never share a line with streamed text.

Each test runs the real command under a pseudo-terminal and reads the final screen through a
terminal emulator (`terminal_screen`): what a spinner frame erased is not on it. `make run`'s
own command (read from the Makefile) runs once on the embedded model."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import keel
from terminal_screen import Screen, run_on_a_terminal

pytest_plugins = ["local_model"]

ROOT = Path(__file__).resolve().parents[1]
SRC = str(Path(keel.__file__).parents[1])
PROVIDER_KEYS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "KEEL_MODEL", "KEEL_STORE")
FIRST_WORDS = "Let me look at the package layout first."
ANSWER = (
    "The run loop lives in src/keel/_run/loop.py and hands each step to take_step; "
    "a repeated call is stopped before its batch is dispatched."
)


def clean_env(tmp_path: Path) -> dict[str, str]:
    """This tree's code, a store of the test's own, no provider key and no chosen model."""
    env = {k: v for k, v in os.environ.items() if k not in PROVIDER_KEYS}
    path = os.pathsep.join(p for p in (SRC, os.environ.get("PYTHONPATH")) if p)
    env.update({"PYTHONPATH": path, "XDG_DATA_HOME": str(tmp_path / "data")})
    return env


def scripted(tmp_path: Path, stream_ms: float | None) -> Path:
    script: dict[str, object] = {
        "turns": [
            {"text": FIRST_WORDS, "tool_calls": [{"name": "list_files", "arguments": {}}]},
            {"text": ANSWER},
        ]
    }
    if stream_ms is not None:
        script["stream_ms"] = stream_ms
    path = tmp_path / "model.json"
    path.write_text(json.dumps(script))
    return path


def keel_run(tmp_path: Path, *args: str) -> Screen:
    (tmp_path / "repo").mkdir(exist_ok=True)
    (tmp_path / "repo" / "notes.md").write_text("notes\n")
    command = [sys.executable, "-m", "keel", "run", "What is the run loop?", *args]
    command += ["--repo", str(tmp_path / "repo")]
    return run_on_a_terminal(command, cwd=tmp_path, env=clean_env(tmp_path), timeout=120)


@pytest.mark.parametrize("stream_ms", [5, None], ids=["streamed", "not-streamed"])
def test_a_scripted_answer_stands_on_the_screen_apart_from_the_progress_lines(
    tmp_path: Path, stream_ms: float | None
) -> None:
    screen = keel_run(tmp_path, "--model", f"script:{scripted(tmp_path, stream_ms)}")
    assert screen.returncode == 0, screen.text
    assert screen.shows(ANSWER), screen.text
    assert screen.text.count(ANSWER[:40]) == 1, screen.text  # once, not again at the end
    # the call's progress line starts a line of its own, after the text streamed before it
    call_lines = [line for line in screen.lines if "list_files {" in line]
    assert call_lines and all(line.startswith("[1] list_files") for line in call_lines), (
        screen.text
    )
    if stream_ms is not None:
        assert FIRST_WORDS in screen.lines, screen.text
    summary = next(i for i, line in enumerate(screen.lines) if line.startswith("completed"))
    answer_at = next(i for i, line in enumerate(screen.lines) if line.startswith(ANSWER[:30]))
    assert answer_at < summary


def test_a_pipe_gets_the_answer_as_plain_text(tmp_path: Path) -> None:
    """stdout a pipe: the answer once, with no escape sequence, whatever stderr is."""
    (tmp_path / "repo").mkdir()
    model = scripted(tmp_path, 5)
    command = [sys.executable, "-m", "keel", "run", "What is the run loop?", "--model"]
    command += [f"script:{model}", "--repo", str(tmp_path / "repo")]
    done = subprocess.run(
        command, capture_output=True, cwd=tmp_path, env=clean_env(tmp_path), timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode() == ANSWER + "\n"
    assert b"\x1b" not in done.stderr


def make_run_command() -> list[str]:
    """`make run`'s command line as the Makefile writes it, its variables put in, with this
    interpreter and this tree's `keel` in place of `.venv/bin/keel`."""
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    variables = dict(re.findall(r"^(\w+) \?= (.*)$", text, re.MULTILINE))
    recipe = text.split("\nrun:", 1)[1].splitlines()[1].strip()
    for name, value in variables.items():
        recipe = recipe.replace(f"$({name})", value)
    words = shlex.split(recipe)
    assert words[0] == "$(BIN)/keel", recipe
    return [sys.executable, "-m", "keel", *words[1:]]


def test_make_runs_command_leaves_the_answer_on_the_screen(
    local_15b_path: Path, tmp_path: Path
) -> None:
    """The newcomer's first command, on the embedded model: the answer was streamed onto the
    spinner's line, erased by its next frame, and not printed again (11 runs of 11)."""
    command = make_run_command()
    screen = run_on_a_terminal(command, cwd=ROOT, env=clean_env(tmp_path), timeout=900)
    assert screen.returncode == 0, screen.raw.decode(errors="replace")[-3000:]
    run_id = re.search(r"run (run_\w+)", screen.text)
    assert run_id is not None, screen.text
    shown = subprocess.run(
        [sys.executable, "-m", "keel", "show", run_id.group(1), "--json"],
        capture_output=True,
        env=clean_env(tmp_path),
        check=True,
    )
    answer = _answer_of(json.loads(shown.stdout))
    assert answer.strip()
    assert screen.shows(answer), screen.text
    assert "loading the embedded model" in screen.text  # the load is announced


def _answer_of(shown: dict[str, Any]) -> str:
    answer = shown["run"]["answer"]
    assert isinstance(answer, str), shown
    return answer
