"""`import keel` only defines things: no exit hooks, threads, signal handlers or files, and none of
the heavy optional modules (Playwright, llama.cpp) until a feature that needs them is used.

The yardstick is a bare interpreter that imports the same standard and third-party modules that
`import keel` pulled in (the standard `logging`, for one, registers an exit hook of its own):
whatever differs from it, Keel's own modules did.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

SNAPSHOT = """
import atexit, importlib, json, signal, sys, threading

def snapshot():
    return {
        "atexit callbacks": atexit._ncallbacks(),
        "threads": sorted(t.name for t in threading.enumerate()),
        "signal handlers": {
            s.name: repr(signal.getsignal(s)) for s in (signal.SIGINT, signal.SIGTERM)
        },
        "excepthook": repr(sys.excepthook),
    }
"""

IMPORT_KEEL = (
    SNAPSHOT
    + """
registered = []
_register = atexit.register
def _recording_register(fn, *args, **kwargs):
    registered.append(f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)}")
    return _register(fn, *args, **kwargs)
atexit.register = _recording_register

already = set(sys.modules)
import keel
state = snapshot()
atexit.register = _register
pulled_in = [
    name for name in sys.modules
    if name not in already and name != "keel" and not name.startswith("keel.")
]
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("playwright", "llama_cpp"))
print(json.dumps({"state": state, "modules": pulled_in, "heavy": heavy, "atexit": registered}))
"""
)

IMPORT_THE_SAME_MODULES = (
    SNAPSHOT
    + """
for name in json.loads(sys.stdin.read()):
    try:
        importlib.import_module(name)
    except Exception:
        pass
print(json.dumps({"state": snapshot()}))
"""
)


def _python(code: str, sandbox: Path, stdin: str = "") -> dict[str, Any]:
    """Run `code` in a fresh interpreter whose home, config, cache and temp folders are inside
    `sandbox`, and return the JSON it prints last."""
    home = sandbox / "home"
    home.mkdir(parents=True)
    (sandbox / "tmp").mkdir()
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("XDG_", "KEEL_")) and key not in {"HOME", "TMPDIR"}
    }
    env.update(
        HOME=str(home),
        TMPDIR=str(sandbox / "tmp"),
        XDG_DATA_HOME=str(home / "data"),
        XDG_CONFIG_HOME=str(home / "config"),
        XDG_CACHE_HOME=str(home / "cache"),
        XDG_STATE_HOME=str(home / "state"),
        PYTHONDONTWRITEBYTECODE="1",
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=sandbox,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_import_keel_has_no_side_effects(tmp_path: Path) -> None:
    with_keel = _python(IMPORT_KEEL, tmp_path / "keel")
    bare = _python(IMPORT_THE_SAME_MODULES, tmp_path / "bare", json.dumps(with_keel["modules"]))

    keel_hooks = [hook for hook in with_keel["atexit"] if hook.startswith("keel")]
    assert keel_hooks == [], "import keel registered exit hooks"
    assert with_keel["state"] == bare["state"], "import keel changed the interpreter's state"
    assert with_keel["heavy"] == [], "import keel imported a heavy optional module"
    sandbox = tmp_path / "keel"
    created = sorted(path.relative_to(sandbox).as_posix() for path in sandbox.rglob("*"))
    assert created == ["home", "tmp"], "import keel created files"
