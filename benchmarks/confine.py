"""What opening every path beneath the root's handle costs the file tools, per call.

What is measured
  The real tool functions (no executor, no thread: the tool's own cost) against a small
  repository in a temporary folder:
    read_file    a 40-line file at depth 1 (`README.md`) and at depth 4 (`a/b/c/d/deep.py`),
                 and through an in-repository link (`link.py` -> `a/b/c/d/deep.py`)
    write_file   appending one line to `a/b/c/d/log.txt`
    list_files   a directory of 50 files
    search_files a tree of 200 small files in 10 folders
  Each figure is microseconds of this process's CPU time per call (`time.process_time`, so
  other work on a shared machine distorts it less than wall time would): the best of
  `--repeats` rounds of `--calls` calls each, with the median of the rounds beside it.

  `--race SECONDS` instead runs the attack of issue 10 for that long and counts what leaked: a
  thread exchanges `repo/d` with a link to an outside folder (`renameat2(RENAME_EXCHANGE)`, as
  fast as it can) while the tools read `d/f.txt`, append to it and create `d/newN.txt` in a
  loop; it prints the calls that succeeded and the outside reads, appends and files created.

Comparing with the code before `keel.tools.confine` (which resolved each path with
`os.path.realpath` and opened it by name): run this script once from this checkout and once
with `PYTHONPATH=<old checkout>/src` in front; it measures whichever `keel` it imports, and
prints that module's path. Timings depend on the machine and its other load: compare figures
from the same machine, taken one after the other.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

try:
    import keel
except ModuleNotFoundError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    import keel

from keel.tools.files import file_tools
from keel.tools.writes import write_tools

TEXT = "".join(f"line {i}: some ordinary source text\n" for i in range(40))


def make_repo(root: Path) -> None:
    deep = root / "a" / "b" / "c" / "d"
    deep.mkdir(parents=True)
    (root / "README.md").write_text(TEXT)
    (deep / "deep.py").write_text(TEXT)
    os.symlink("a/b/c/d/deep.py", root / "link.py")
    listed = root / "listed"
    listed.mkdir()
    for i in range(50):
        (listed / f"file{i:02d}.txt").write_text("x\n")
    for folder in range(10):
        tree = root / "tree" / f"pkg{folder}"
        tree.mkdir(parents=True)
        for i in range(20):
            (tree / f"mod{i}.py").write_text(TEXT)


def per_call(fn: Callable[..., str], calls: int, repeats: int, **arguments: Any) -> list[float]:
    """CPU microseconds per call, one figure per round."""
    fn(**arguments)  # warm up: first-call imports and caches out of the figures
    rounds = []
    for _ in range(repeats):
        started = time.process_time()
        for _ in range(calls):
            fn(**arguments)
        rounds.append((time.process_time() - started) / calls * 1e6)
    return rounds


SECRET = "SECRET-outside-the-repo"


def race(seconds: float) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    with tempfile.TemporaryDirectory() as tmp:
        root, outside = Path(tmp) / "repo", Path(tmp) / "outside"
        (root / "d").mkdir(parents=True)
        outside.mkdir()
        (root / "d" / "f.txt").write_text("inside\n")
        (outside / "f.txt").write_text(f"{SECRET}\n")
        os.symlink(outside, root / "d.link")
        stop = threading.Event()
        swaps = 0

        def swap() -> None:  # RENAME_EXCHANGE (2) between two names, relative to the cwd (-100)
            nonlocal swaps
            a, b = bytes(root / "d"), bytes(root / "d.link")
            while not stop.is_set():
                if libc.renameat2(-100, a, -100, b, 2) != 0:
                    raise OSError(ctypes.get_errno(), "renameat2")
                swaps += 1

        tools = {t.name: t.fn for t in file_tools(root) + write_tools(root)}
        calls: list[tuple[str, dict[str, Any]]] = [
            ("read_file", {"path": "d/f.txt"}),
            ("write_file", {"path": "d/f.txt", "content": "a\n", "append": True}),
        ]
        done = {name: 0 for name in ("read_file", "write_file append", "write_file create")}
        outside_reads = n = 0
        swapper = threading.Thread(target=swap, daemon=True)
        swapper.start()
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            n += 1
            for (name, arguments), label in zip(
                [*calls, ("write_file", {"path": f"d/new{n}.txt", "content": "n\n"})],
                done,
                strict=True,
            ):
                try:
                    text = tools[name](**arguments)
                    done[label] += 1
                except Exception as exc:
                    text = str(exc)
                outside_reads += SECRET in text
        stop.set()
        swapper.join()
        if (root / "d").is_symlink():
            libc.renameat2(-100, bytes(root / "d"), -100, bytes(root / "d.link"), 2)
        appends = (outside / "f.txt").read_text().count("a\n")
        created = sum(1 for p in outside.iterdir() if p.name.startswith("new"))
        print(f"{seconds:g} s, {n * 3} calls, {swaps} swaps; succeeded: {done}")
        print(f"outside reads {outside_reads}, outside appends {appends}, outside files {created}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--calls", type=int, default=10_000, help="calls per round")
    parser.add_argument("--repeats", type=int, default=5, help="rounds per figure")
    parser.add_argument("--race", type=float, metavar="SECONDS", help="run the swap attack")
    args = parser.parse_args()
    print(f"keel from {Path(keel.__file__).parent}")
    if args.race:
        race(args.race)
        return
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "repo"
        make_repo(root)
        tools = {t.name: t.fn for t in file_tools(root) + write_tools(root)}
        cases: list[tuple[str, str, int, dict[str, Any]]] = [
            ("read_file README.md", "read_file", args.calls, {"path": "README.md"}),
            ("read_file a/b/c/d/deep.py", "read_file", args.calls, {"path": "a/b/c/d/deep.py"}),
            ("read_file link.py (a link)", "read_file", args.calls, {"path": "link.py"}),
            (
                "write_file append, depth 4",
                "write_file",
                args.calls,
                {"path": "a/b/c/d/log.txt", "content": "x\n", "append": True},
            ),
            ("list_files (50 entries)", "list_files", args.calls // 10, {"path": "listed"}),
            (
                "search_files (200 files)",
                "search_files",
                max(args.calls // 100, 1),
                {"pattern": "line 39", "path": "tree"},
            ),
        ]
        print(f"{'call':<30} {'calls':>7} {'best CPU us/call':>17} {'median':>9}")
        for label, name, calls, arguments in cases:
            rounds = per_call(tools[name], calls, args.repeats, **arguments)
            best, median = min(rounds), statistics.median(rounds)
            print(f"{label:<30} {calls:>7} {best:>17.1f} {median:>9.1f}")


if __name__ == "__main__":
    main()
