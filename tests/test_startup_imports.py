"""The command line starts without the heavy libraries it does not need (issue 25, ADR 0042).

`keel --help` lists commands and their options: it needs typer and Keel's option definitions,
not the model SDKs, the HTTP client, the store, the event loop or pydantic. A scripted one-answer
`keel run` needs the run core, the store and pydantic, but no HTTP client, model SDK, MCP,
OpenTelemetry, web framework or llama.cpp: those load when a command, a tool or a tracer
provider uses them. Each check runs a fresh
interpreter on this checkout's `src` and reads `sys.modules` at its end.
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"

# Loaded by none of: `import keel`, `import keel.cli.app`, `keel --help`, `keel run --help`.
NOT_FOR_HELP = (
    "openai",  # the transports' SDKs: built when a run names its model
    "anthropic",
    "httpx",  # the HTTP client (and httpx's own CLI: click, pygments): fetch, provider calls
    "httpcore",
    "h11",
    "anyio",
    "mcp",  # MCP servers: started by a run given --mcp
    "opentelemetry",  # spans: the run core's, and --otel's SDK
    "llama_cpp",  # the embedded model: --model local
    "numpy",
    "starlette",  # `keel ui`
    "uvicorn",
    "jinja2",
    "jsonschema",  # --output-schema, MCP tool schemas
    "html2text",  # fetch's page rendering
    "re2",  # the file tools' search patterns
    "playwright",  # --browser
    "psycopg",  # a postgresql:// store
    "dbos",
    "sqlite3",  # the store
    "asyncio",  # the run loop
)
# typer itself loads pydantic to convert a command's option values (a command's own --help
# too), so only the start and the command list go without it.
NOT_FOR_THE_COMMAND_LIST = (*NOT_FOR_HELP, "pydantic", "pydantic_core")

# Loaded by no one-answer scripted `keel run` (it calls no tool and no provider, and nothing
# traces it).
NOT_FOR_A_SCRIPTED_RUN = (
    "openai",
    "anthropic",
    "httpx",
    "httpcore",
    "h11",
    "anyio",
    "mcp",
    "opentelemetry",
    "llama_cpp",
    "numpy",
    "starlette",
    "uvicorn",
    "jinja2",
    "jsonschema",
    "html2text",
    "playwright",
    "psycopg",
    "dbos",
    "re2",  # the search tool's patterns: the first search compiles one
    "html",  # fetch's page titles
)
# Modules (not packages) a scripted run does not load either: `keel show`'s table, and rich's
# emoji table (the command line prints text as it came, emoji codes too).
NOT_FOR_A_SCRIPTED_RUN_MODULES = ("rich.table", "rich._emoji_codes")

KEEL = "from keel.cli.app import main; import sys; sys.argv = ['keel', *ARGS]; main()"
REPORT = """
import atexit, json, sys
atexit.register(lambda: sys.__stderr__.write("\\nMODULES " + json.dumps(sorted(sys.modules))))
"""


def loaded(code: str, tmp_path: Path) -> set[str]:
    """The top-level packages in `sys.modules` when a fresh interpreter running `code` exits."""
    return {name.split(".")[0] for name in loaded_modules(code, tmp_path)}


def loaded_modules(code: str, tmp_path: Path) -> set[str]:
    """The modules in `sys.modules` when a fresh interpreter running `code` exits."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
        "HOME": str(tmp_path),  # no user keel.toml decides anything here
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "XDG_DATA_HOME": str(tmp_path / "data"),
    }
    env.pop("KEEL_STORE", None)
    done = subprocess.run(
        [sys.executable, "-c", REPORT + code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    modules: list[str] = json.loads(done.stderr.rpartition("\nMODULES ")[2])
    return set(modules)


def keel_command(*args: str) -> str:
    return KEEL.replace("*ARGS", ", ".join(repr(a) for a in args))


@pytest.mark.parametrize(
    "code",
    ["import keel", "import keel.cli.app", keel_command("--help")],
    ids=["import keel", "import keel.cli.app", "keel --help"],
)
def test_the_command_line_starts_without_heavy_modules(code: str, tmp_path: Path) -> None:
    assert sorted(loaded(code, tmp_path) & set(NOT_FOR_THE_COMMAND_LIST)) == []


@pytest.mark.parametrize("command", ["run", "eval", "replay", "ui", "show", "worker"])
def test_a_commands_help_loads_no_heavy_module(command: str, tmp_path: Path) -> None:
    assert sorted(loaded(keel_command(command, "--help"), tmp_path) & set(NOT_FOR_HELP)) == []


def test_a_scripted_run_loads_no_http_client_sdk_or_model(tmp_path: Path) -> None:
    script = "script:examples/one_answer.json"
    store = str(tmp_path / "runs.db")
    code = keel_command("run", "What is Keel?", "--model", script, "--repo", ".", "--store", store)
    code = f"try:\n    {code}\nexcept SystemExit as exc:\n    assert exc.code == 0, exc.code\n"
    modules = loaded_modules(code, tmp_path)
    packages = {name.split(".")[0] for name in modules}
    assert sorted(packages & set(NOT_FOR_A_SCRIPTED_RUN)) == []
    assert sorted(modules & set(NOT_FOR_A_SCRIPTED_RUN_MODULES)) == []


def test_the_check_sees_a_heavy_module(tmp_path: Path) -> None:
    """The check can fail: an interpreter that imports httpx is caught."""
    assert "httpx" in loaded("import keel.cli.app, httpx", tmp_path) & set(NOT_FOR_HELP)


@pytest.mark.parametrize("package", ["keel", "keel.evals", "keel._run"])
def test_the_lazy_names_are_the_type_checking_imports(package: str) -> None:
    """`_WHERE` (what runs) names the same modules as the TYPE_CHECKING imports (what type
    checkers read), and `__all__` lists exactly those names."""
    path = SRC.joinpath(*package.split("."), "__init__.py")
    tree = ast.parse(path.read_text(encoding="utf-8"))
    imported: dict[str, str] = {}
    where: dict[str, str] = {}
    listed: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.If):
            for inner in node.body:
                if isinstance(inner, ast.ImportFrom) and inner.module:
                    imported.update({a.asname or a.name: inner.module for a in inner.names})
        elif isinstance(node, ast.AnnAssign) and ast.unparse(node.target) == "_WHERE":
            where = ast.literal_eval(node.value)  # type: ignore[arg-type]
        elif isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "__all__":
            listed = ast.literal_eval(node.value)
    assert imported and imported == where
    assert sorted(listed) == sorted(where)


def test_every_lazy_name_is_its_modules_object() -> None:
    import importlib

    import keel
    import keel._run
    import keel.evals

    for package in (keel, keel.evals, keel._run):
        for name in package.__all__:
            module = importlib.import_module(package._WHERE[name])  # type: ignore[attr-defined]
            assert getattr(package, name) is getattr(module, name), (package.__name__, name)
    assert "Agent" in dir(keel)
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        _ = keel.Nothing  # type: ignore[attr-defined]


def said(command: Any, args: list[str]) -> tuple[str, object]:
    """What a click command prints for `args` (stdout and stderr together) and its exit code."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            command.main(args, prog_name="keel")
        except SystemExit as exc:
            return out.getvalue(), exc.code
    return out.getvalue(), None


def test_a_command_is_built_alone_and_reads_as_in_the_whole_app() -> None:
    """`keel NAME ...` builds NAME's options only (ADR 0042); its help and its usage errors
    are the whole app's, word for word; no name, `--help` or an unknown name get the whole app."""
    import typer

    from keel.cli.app import app, command_line, command_name

    whole = typer.main.get_command(app)
    names = [command_name(info) for info in app.registered_commands]
    assert len(names) > 10 and "run" in names
    assert "Usage: keel run [OPTIONS]" in said(whole, ["run", "--help"])[0]
    for name in names:
        alone = command_line([name])
        assert list(alone.commands) == [name]  # type: ignore[attr-defined]
        for args in ([name, "--help"], [name, "--no-such-option"]):
            assert said(alone, args) == said(whole, args), args
    assert said(command_line(["run"]), ["run"]) == said(whole, ["run"])  # no QUESTION
    for first in ([], ["--help"], ["no-such-command"]):
        assert command_line(first) is app
