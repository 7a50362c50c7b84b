"""Public names of a package imported from their modules on first use (PEP 562), so importing
the package costs nearly nothing: the command line imports `keel` on every start (ADR 0042).

The package lists its names twice: as ordinary imports under ``TYPE_CHECKING`` (what type
checkers and readers see) and in a mapping name -> module (what runs);
tests/test_startup_imports.py checks that the two agree.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["exports"]


def exports(
    package: str, where: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The package's module-level ``__getattr__`` and ``__dir__``: a name in `where` is imported
    from its module once and then kept in the package like an ordinary import."""
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *where})

    return __getattr__, __dir__
