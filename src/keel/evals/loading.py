"""Loading scenarios: files, folders and built-in names, validated with clear errors.

A scenario file is checked whole when it is loaded (its fields, its limits against
`keel.Limits`, its script against `keel.ScriptedTransport`), so `keel eval` refuses a typo
before anything runs, and every message names the file and the field: ``scenario
evals/deploy.toml: pages[0].settle_after: Input should be greater than or equal to 1``.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import pydantic
from pydantic_core import ErrorDetails

from keel.errors import ConfigError
from keel.evals.scenario import SUFFIXES, Scenario, ScenarioSpec
from keel.evals.suites import DEFAULT_SUITE, RENAMED_SUITES, SUITES
from keel.limits import Limits
from keel.transports.scripted import ScriptedTransport

__all__ = [
    "DEFAULT_SUITE",
    "SUITES",
    "builtin_folder",
    "builtin_names",
    "load_file",
    "parse",
    "resolve",
]




def builtin_folder(suite: str = DEFAULT_SUITE) -> Path:
    if suite in RENAMED_SUITES:
        from keel.run_options import note_renamed

        note_renamed(f"--suite {suite}", f"--suite {RENAMED_SUITES[suite]}")
        suite = RENAMED_SUITES[suite]
    if suite not in SUITES:
        raise ConfigError(f"no built-in suite {suite!r}; the suites are {', '.join(SUITES)}")
    return Path(str(resources.files("keel.evals").joinpath(SUITES[suite])))


def builtin_names(suite: str = DEFAULT_SUITE) -> list[str]:
    return sorted(p.stem for p in builtin_folder(suite).glob("*.toml"))


def load_file(path: str | Path) -> Scenario:
    """Read and validate one scenario file; every problem is a ConfigError naming the file."""
    path = Path(path)
    if path.suffix not in SUFFIXES:
        raise ConfigError(f"scenario {path}: a scenario file ends with .toml or .json")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"scenario {path}: cannot read it: {exc}") from None
    try:
        data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"scenario {path}: not valid TOML: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"scenario {path}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    return parse(data, str(path), default_name=path.stem)


def parse(data: Any, source: str, *, default_name: str) -> Scenario:
    if not isinstance(data, dict):
        raise ConfigError(f"scenario {source}: the top level must be a table (object)")
    try:
        spec = ScenarioSpec.model_validate(data)
    except pydantic.ValidationError as exc:
        problems = "\n  ".join(_describe_all(exc.errors()))
        raise ConfigError(f"scenario {source}:\n  {problems}") from None
    try:
        limits = Limits(**spec.limits.model_dump())
    except ConfigError as exc:
        raise ConfigError(f"scenario {source}: limits: {exc}") from None
    if spec.script is not None:
        try:
            ScriptedTransport.from_dict(spec.script, source)
        except ConfigError as exc:
            raise ConfigError(f"scenario {source}: {_script_problems(exc, source)}") from None
    return Scenario(spec.name or default_name, source, spec, limits)


def resolve(args: Sequence[str], suite: str = DEFAULT_SUITE) -> list[Scenario]:
    """Scenarios for the command line: built-in names (of `suite`), files and folders; none
    means all of `suite`. A bare name that matches a built-in scenario is the built-in one
    (write ``./loop`` for a folder of that name)."""
    builtin = builtin_names(suite)
    found: list[Scenario] = []
    for arg in args or builtin:
        if arg in builtin and "/" not in arg:
            found.append(load_file(builtin_folder(suite) / f"{arg}.toml"))
            continue
        path = Path(arg)
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.suffix in SUFFIXES and p.is_file())
            if not files:
                raise ConfigError(f"no scenario files (*.toml, *.json) in the folder {arg}")
            found.extend(load_file(p) for p in files)
        elif path.is_file():
            found.append(load_file(path))
        else:
            raise ConfigError(
                f"{arg!r} is neither a built-in scenario ({', '.join(builtin)}) nor a scenario "
                "file or folder"
            )
    return _unique(found)


def _unique(scenarios: Iterable[Scenario]) -> list[Scenario]:
    """Each file once, in the order given; two files may not share a name (rows would clash)."""
    seen: dict[str, str] = {}
    unique: list[Scenario] = []
    for s in scenarios:
        if s.name in seen:
            if seen[s.name] == s.source:
                continue
            raise ConfigError(
                f"two scenarios are named {s.name!r} ({seen[s.name]} and {s.source}); "
                "rename one (the name field, or the file)"
            )
        seen[s.name] = s.source
        unique.append(s)
    return unique


_UNION_MEMBERS = frozenset({"int", "constrained-int", "Bounds", "literal[False]"})
_COUNT_HELP = "a count is a whole number (0 or more) or a table { min = N, max = M }"


def _path(loc: tuple[int | str, ...]) -> str:
    """A pydantic location as ``pages[2].size_kb``, without union tags and members."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not part.startswith("~") and part not in _UNION_MEMBERS:
            if not part.isidentifier():
                out += f'["{part}"]'  # a page path used as a key
            else:
                out += f".{part}" if out else part
    return out or "(top level)"


def _describe_all(errors: list[ErrorDetails]) -> list[str]:
    """One line per problem; the alternatives of a count (number or table) become one line."""
    lines: list[str] = []
    for error in errors:
        loc = error["loc"]
        if any(part in ("constrained-int", "Bounds") for part in loc):
            line = f"{_path(loc)}: {_COUNT_HELP}"
            if error["type"] in ("missing", "extra_forbidden"):
                line = f"{_path(loc[:-1])}: {_COUNT_HELP}"
        else:
            line = _describe(error)
        if line not in lines:
            lines.append(line)
    return lines


def _describe(error: ErrorDetails) -> str:
    loc = error["loc"]
    if error["type"] in ("missing", "extra_forbidden") and loc and isinstance(loc[-1], str):
        what = "missing field" if error["type"] == "missing" else "unknown field"
        return f'{_path(loc[:-1])}: {what} "{loc[-1]}"'
    message = error["msg"]
    if error["type"] == "value_error":
        message = str(error.get("ctx", {}).get("error", message))
        if not loc:
            return message  # a check across fields names its own fields
    return f"{_path(loc)}: {message}"


def _script_problems(exc: ConfigError, source: str) -> str:
    """The scripted transport's message, with its paths made relative to the scenario file."""
    text = str(exc).removeprefix(f"script {source}: ")
    lines = [
        "script" + line.removeprefix("(top level)")
        if line.startswith("(top level)")
        else f"script.{line}"
        for line in text.split("\n  ")
    ]
    return "\n  ".join(lines)
