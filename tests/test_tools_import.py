"""Importing Keel's tools has no side effects, and every tools module states its public names."""

from __future__ import annotations

import importlib
import pkgutil

import keel.tools
from isolated import run_python

# -- import side effects and the public surface ----------------------------------------------


def test_importing_keel_registers_no_exit_hook() -> None:
    proc = run_python(
        """
        import atexit
        registered = []
        register = atexit.register
        def spy(fn, *args, **kwargs):
            registered.append(f"{getattr(fn, '__module__', '?')}.{fn.__qualname__}")
            return register(fn, *args, **kwargs)
        atexit.register = spy
        import keel
        print([name for name in registered if name.startswith("keel")])
        """,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_every_tools_module_declares_all_and_defines_it() -> None:
    for info in pkgutil.iter_modules(keel.tools.__path__, "keel.tools."):
        module = importlib.import_module(info.name)
        names = getattr(module, "__all__", None)
        assert isinstance(names, list), f"{info.name} has no __all__"
        assert all(hasattr(module, name) for name in names), info.name
