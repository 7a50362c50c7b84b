"""What a new user meets in the first hour (issue 37): `keel runs` with a header row and the
time each run started, `keel show` with the first line of each tool result, a fetch whose host
is not found worded as a failed lookup (not as the host guard refusing it), and `make demo`'s
scripted answer checked against the code it describes."""

from __future__ import annotations

import ast
import json
import re
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from keel.cli.app import app
from keel.tools.netguard import check_url

ROOT = Path(__file__).resolve().parent.parent


def cli(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


def one_run(tmp_path: Path) -> tuple[str, str]:
    (tmp_path / "notes.md").write_text("The widget listens on port 8421.\nSet WIDGET_PORT.\n")
    script = tmp_path / "script.json"
    turns = [
        {"tool_calls": [{"name": "read_file", "arguments": {"path": "notes.md"}}]},
        {"text": "Port 8421."},
    ]
    script.write_text(json.dumps({"turns": turns}))
    store = str(tmp_path / "runs.sqlite")
    ran = cli("run", "Which port?", "--model", f"script:{script}", "--repo", str(tmp_path),
              "--store", store, "--json")  # fmt: skip
    assert ran.exit_code == 0, ran.stderr
    return json.loads(ran.stdout)["run_id"], store


def test_keel_runs_has_a_header_row_and_a_started_column(tmp_path: Path) -> None:
    run_id, store = one_run(tmp_path)
    lines = cli("runs", "--store", store).stdout.splitlines()
    assert lines[0].split() == ["RUN", "STARTED", "STATUS", "MODEL", "TOOLS", "COST", "QUESTION"]
    assert lines[1].startswith(run_id)
    started = time.strftime("%Y-%m-%d %H:", time.localtime())
    assert started[:13] in lines[1]  # the day and hour it started, local time
    assert lines[0].index("STATUS") == lines[1].index("completed")


def test_keel_runs_on_an_empty_store_prints_no_header(tmp_path: Path) -> None:
    listed = cli("runs", "--store", str(tmp_path / "empty.sqlite"))
    assert "RUN" not in listed.stdout


def test_keel_show_gives_the_first_line_of_each_tool_result(tmp_path: Path) -> None:
    run_id, store = one_run(tmp_path)
    shown = cli("show", run_id, "--store", store).stdout
    line = next(line for line in shown.splitlines() if "tool result" in line)
    assert "notes.md: lines 1-2 of 2" in line  # read_file's first line: what was read
    assert "WIDGET_PORT" not in shown  # the rest stays in the store (and `keel show --json`)


async def test_a_host_that_is_not_found_is_a_failed_lookup_not_a_refusal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def fail(host: str, *args: Any, **kwargs: Any) -> list[Any]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", fail)
    said = await check_url("https://no-such-host.invalid/", allow_hosts=())
    assert said is not None and not said.startswith("refused")
    assert said.startswith("could not fetch 'https://no-such-host.invalid/'")
    assert "not found" in said and "DNS" in said


def _imports(path: Path) -> set[str]:
    """The keel modules `path` imports (`from keel._run import x` counts keel._run.x too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("keel"):
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("keel"))
    return found


def _defines(path: Path, name: str) -> bool:
    tree = ast.parse(path.read_text())
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return any(isinstance(node, kinds) and node.name == name for node in ast.walk(tree))


def test_make_demos_scripted_answer_says_what_the_code_says() -> None:
    """Every module the answer says the run loop imports, it imports; every function it names
    with a file is defined in that file; no `Class.method` it names is missing."""
    answer = json.loads((ROOT / "examples" / "repeated_research.json").read_text())
    text: str = answer["on_synthesis"]["text"]
    loop = ROOT / "src" / "keel" / "_run" / "loop.py"
    imported = _imports(loop)
    sentence = text.split(" imports ", 1)[1].split(". ", 1)[0]
    named = set(re.findall(r"keel(?:\.\w+)+", sentence))
    assert named and named <= imported, sorted(named - imported)
    placed = re.findall(r"(\w+) (?:in|of) (src/keel/[\w/]+\.py)", text)
    assert placed and all(_defines(ROOT / file, name) for name, file in placed), placed
    for owner, member in re.findall(r"\b([A-Z]\w+)\.(\w+)", text):
        homes = [p for p in (ROOT / "src" / "keel").rglob("*.py") if _defines(p, owner)]
        assert any(_defines(p, member) for p in homes), f"{owner}.{member}"
