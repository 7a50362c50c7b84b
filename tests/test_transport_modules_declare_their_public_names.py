"""Every transport module draws its public boundary with an explicit ``__all__`` (issue 8).

Each name listed must exist, and every public function, class or constant a module defines at
its top level must be listed, so a new helper is private unless someone decides otherwise.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

import keel.transports

MODULES = sorted(
    info.name for info in pkgutil.walk_packages(keel.transports.__path__, "keel.transports.")
)
"""Every module under keel/transports, the embedded model's package (`local/`) included."""


def defined_at_top_level(path: Path) -> set[str]:
    """Public names a module's own source defines: functions, classes and assignments."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {name for name in names if not name.startswith("_")}


@pytest.mark.parametrize("name", ["keel.transports", *MODULES])
def test_the_module_lists_its_public_names(name: str) -> None:
    module = importlib.import_module(name)
    exported = vars(module).get("__all__")
    assert isinstance(exported, list), f"{name} has no __all__"
    assert all(hasattr(module, member) for member in exported)
    assert len(exported) == len(set(exported))


@pytest.mark.parametrize("name", MODULES)
def test_every_public_definition_is_exported(name: str) -> None:
    module = importlib.import_module(name)
    assert module.__file__ is not None
    missing = defined_at_top_level(Path(module.__file__)) - set(module.__all__)
    assert not missing, f"{name} defines {sorted(missing)} but does not list them in __all__"
