"""The documents stay true: the README's layout table names exactly the modules of `src/keel`,
and every test an ADR names as its guard exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "keel"
GUARD = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")


def layout_table() -> list[str]:
    """The first cell of every row of the table under "## Layout": one module each."""
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    cells = [row.split("|")[1].strip() for row in rows[2:]]  # past the header and the rule
    return [cell.strip("`") for cell in cells]


def package_modules() -> set[str]:
    """Every module of the package, as the table names it: a package by its folder."""
    names = set()
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE)
        if path.name == "__init__.py" and relative.parent != Path("."):
            names.add(f"{relative.parent.as_posix()}/")
        else:
            names.add(relative.as_posix())
    return names


def test_the_readme_layout_table_lists_every_module_once() -> None:
    listed = layout_table()
    assert len(listed) == len(set(listed)), "a module is listed twice"
    modules = package_modules()
    assert {"not in the table": modules - set(listed), "no such module": set(listed) - modules} == {
        "not in the table": set(),
        "no such module": set(),
    }


def defined_tests(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test")
    }


def adr_guards() -> list[tuple[str, str, str]]:
    return [
        (adr.name, file, name)
        for adr in sorted((ROOT / "docs" / "adr").glob("*.md"))
        for file, name in GUARD.findall(adr.read_text())
    ]


def test_every_test_an_adr_names_exists() -> None:
    guards = adr_guards()
    assert guards, "no ADR names a guarding test"
    missing = [
        f"{adr}: {file}::{name}"
        for adr, file, name in guards
        if not (ROOT / file).is_file() or name not in defined_tests(ROOT / file)
    ]
    assert missing == []


def test_every_adr_names_a_guarding_test() -> None:
    guarded = {adr for adr, _, _ in adr_guards()}
    adrs = {adr.name for adr in (ROOT / "docs" / "adr").glob("*.md")}
    assert adrs - guarded == set()
