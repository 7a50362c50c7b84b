"""Counting the fsyncs a Keel process issues, per thread and per commit, with strace.

A child process runs real runs (a zero-latency scripted model, a read_only tool returning a
fixed text) against a real store, between two marker syscalls (a stat of a path that does not
exist), and prints its store threads' ids and commit count. `strace -f` logs every fsync and
fdatasync with the thread that made it, and every stat: the writer stats the store file once
per commit, just before COMMIT (the check that the file is still the one it opened), so the
fsyncs between two of those stats belong to one commit.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["STRACE", "Trace", "trace_runs"]

STRACE = shutil.which("strace")

_MARK = "/keel-fsync-mark-{}"
_LINE = re.compile(r"^(\d+)\s+(\w+)\((.*)$")
_SYNCS = {"fsync", "fdatasync"}
_STATS = {"stat", "newfstatat", "statx", "fstatat64", "lstat"}

CHILD = """
import asyncio, json, os, sys
import keel

path, durability, runs, turns, kb = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
text = ("Lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 400)[: kb * 1024]

@keel.tool(effect="read_only")
async def read_chunk(n: int) -> str:
    '''Return chunk n (each its own, as a real file's are: a repeat tier sees no loop).'''
    return f"{n:08d}{text[8:]}"

def agent(store):
    script = {"turns": [{"tool_calls": [{"name": "read_chunk", "arguments": {"n": i}}]}
                        for i in range(turns - 1)] + [{"text": "done"}]}
    limits = keel.Limits(max_model_calls=turns + 5, max_tool_calls=turns + 5)
    return keel.Agent(keel.ScriptedTransport.from_dict(script), tools=[read_chunk],
                      limits=limits, store=store)

def mark(name):
    try:
        os.stat(MARK.format(name))
    except OSError:
        pass

async def main():
    store = keel.Store(path, durability=durability)
    worker = store._worker
    agents = [agent(store) for _ in range(runs)]
    before = worker.commits
    mark("begin")
    results = await asyncio.gather(*(a.arun("Read the chunks.") for a in agents))
    mark("end")
    commits = worker.commits - before
    assert all(r.status == "completed" for r in results), results
    ids = {"worker": worker.native_id, "keeper": worker.wal.native_id, "commits": commits,
           "restarts": worker.wal.restarts}
    store.close()
    print(json.dumps(ids))

asyncio.run(main())
""".replace("MARK", repr(_MARK))


@dataclass
class Trace:
    steps: int
    commits: int
    """Transactions the store committed between the markers."""
    restarts: int
    """Times the WAL keeper restarted the log."""
    worker: list[int] = field(default_factory=list)
    """Fsyncs of each commit on the store's thread, in order."""
    keeper: int = 0
    """Fsyncs of the WAL keeper's thread (checkpoints and log restarts)."""
    other: int = 0
    """Fsyncs of any other thread."""

    @property
    def total(self) -> int:
        return sum(self.worker) + self.keeper + self.other


def trace_runs(folder: Path, durability: str, runs: int, turns: int, kb: int = 20) -> Trace:
    """Trace `runs` runs of `turns` turns sharing one store in `folder`."""
    assert STRACE is not None
    store = folder / "traced.sqlite"
    log = folder / "strace.log"
    calls = "trace=" + ",".join(sorted(_SYNCS | _STATS))
    child = [sys.executable, "-c", CHILD, str(store), durability, str(runs), str(turns), str(kb)]
    done = None
    for fast in (["--seccomp-bpf"], []):  # seccomp filtering when the kernel allows it
        done = subprocess.run(
            [STRACE, "-f", *fast, "-o", str(log), "-e", calls, *child],
            capture_output=True,
            text=True,
            timeout=600,
        )
        if done.returncode == 0:
            break
    assert done is not None and done.returncode == 0, done and done.stderr[-3000:]
    ids = json.loads(done.stdout.strip().splitlines()[-1])
    trace = Trace(steps=runs * turns, commits=ids["commits"], restarts=ids["restarts"])
    inside = False
    current: int | None = None
    quoted = f'"{store}"'
    for line in log.read_text().splitlines():
        match = _LINE.match(line)
        if match is None:
            continue
        tid, name, rest = int(match.group(1)), match.group(2), match.group(3)
        if _MARK.format("begin") in rest:
            inside = True
        elif _MARK.format("end") in rest:
            inside = False
        elif not inside:
            continue
        elif name in _STATS and tid == ids["worker"] and quoted in rest:
            trace.worker.append(0)  # a commit begins
            current = len(trace.worker) - 1
        elif name in _SYNCS:
            if tid == ids["worker"]:
                if current is None:
                    trace.worker.append(0)
                    current = 0
                trace.worker[current] += 1
            elif tid == ids["keeper"]:
                trace.keeper += 1
            else:
                trace.other += 1
    return trace
