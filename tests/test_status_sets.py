"""The sets of run statuses are defined once, beside `RunStatus` (keel/result.py), with names
that say what they mean; every reader names one (issue 31: `ENDED` meant two different sets)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import get_args

from keel.result import LIVE, OVER, STATUSES, TERMINAL, RunStatus

SRC = Path(__file__).resolve().parents[1] / "src" / "keel"


def test_every_status_is_live_or_terminal_never_both() -> None:
    assert set(STATUSES) == set(get_args(RunStatus))
    assert len(STATUSES) == len(set(STATUSES))
    assert set(LIVE) | set(TERMINAL) == set(STATUSES)
    assert not set(LIVE) & set(TERMINAL)


def test_a_run_that_is_over_is_terminal_and_a_cancelled_one_is_not_over() -> None:
    assert set(OVER) < set(TERMINAL)
    assert set(TERMINAL) - set(OVER) == {"cancelled"}
    assert "awaiting_approval" in LIVE and "queued" in LIVE


def _status_sets(tree: ast.AST) -> list[int]:
    """Lines of tuples, lists and sets of two or more status names, outside annotations."""
    in_subscripts = {
        id(node.slice) for node in ast.walk(tree) if isinstance(node, ast.Subscript)
    }
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Tuple | ast.List | ast.Set) or id(node) in in_subscripts:
            continue
        values = [e.value for e in node.elts if isinstance(e, ast.Constant)]
        if len(values) == len(node.elts) >= 2 and all(v in STATUSES for v in values):
            found.append(node.lineno)
    return found


def test_no_module_but_result_lists_a_set_of_statuses() -> None:
    found = {
        str(path.relative_to(SRC)): lines
        for path in sorted(SRC.rglob("*.py"))
        if path.name != "result.py" or path.parent != SRC
        if (lines := _status_sets(ast.parse(path.read_text(), str(path))))
    }
    assert found == {}


def test_the_check_finds_a_set_written_by_hand() -> None:
    tree = ast.parse('ENDED = ("completed", "failed")\nKind = Literal["completed", "failed"]\n')
    assert _status_sets(tree) == [1]
