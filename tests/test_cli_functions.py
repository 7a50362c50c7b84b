"""The command line stays a thin layer (ADR 0058): no function in `src/keel/cli/` is longer than
60 lines, counted from its `def` to its last line (decorators aside, its parameters and
docstring in). A command that grows past it wants named parts, not a longer body."""

from __future__ import annotations

import ast
from pathlib import Path

CLI = Path(__file__).resolve().parents[1] / "src" / "keel" / "cli"
MOST = 60


def long_functions(source: str, most: int = MOST) -> list[str]:
    """Each function (nested ones too) of `source` longer than `most` lines, with its length."""
    return [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > most
    ]


def test_no_function_of_the_command_line_is_over_60_lines() -> None:
    found = {
        path.name: long
        for path in sorted(CLI.glob("*.py"))
        if (long := long_functions(path.read_text()))
    }
    assert found == {}


def test_the_length_check_counts_from_def_to_the_end_and_not_the_decorators() -> None:
    body = "\n".join(f"    x{n} = {n}" for n in range(59))
    at_most = f"@decorated\n@twice\ndef fits() -> None:\n{body}\n"  # 60 lines with its def
    assert long_functions(at_most) == []
    over = f"def grows() -> None:\n{body}\n    x = 60\n"
    assert long_functions(over) == ["grows (61 lines)"]
