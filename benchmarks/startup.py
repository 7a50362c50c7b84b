"""How long the command line takes to start, against the bare interpreter on the same machine.

What is measured
  Each command runs as a fresh process (the way a person or a script runs `keel`), from the
  repository root with ``PYTHONPATH`` set to the checkout's ``src``, so the figures are this
  checkout's whatever is installed:
    bare          ``python -c pass``: the interpreter's own start, the unit of the table;
    import keel   ``python -c "import keel"``: the library's import;
    keel --help   the command line's help;
    keel run      a one-answer scripted run (``--model script:examples/one_answer.json``) into a
                  throwaway SQLite store: parse options, build the agent and its tools, open the
                  store, run one model turn, print the answer and the summary.
  ``keel`` is started as its console script does it (``from keel.cli.app import main; main()``
  under ``python -c``), so an install is not needed. Rounds interleave the commands (each round
  runs each once, in turn) so a drifting machine load falls on all of them alike; the figure is
  the median wall time of a command over the rounds, and "x bare" is that over bare's median;
  the same for CPU time (user + system, from ``getrusage``), which other load disturbs less.
  One warm-up round is not counted (it creates the store and fills the OS page cache).
  Each checkout's modules are compiled to bytecode (``compileall``) before the rounds, as
  ``pip install`` does: with ``PYTHONDONTWRITEBYTECODE`` set (as in this project's shells) a
  checkout never caches its bytecode and every start would compile every module it imports.
  ``--src DIR`` (repeatable, ``LABEL=DIR`` to name it) measures other checkouts in the same run,
  e.g. the code before a change beside the code after it.

Targets (issue 25): keel --help <= 15x bare, the scripted keel run <= 30x bare. PASS/FAIL is
printed; the exit status is 1 on FAIL only with ``--check``. Timings depend on the machine and
its other load: the load average is printed before and after.
"""

from __future__ import annotations

import argparse
import compileall
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUESTION = "What is Keel?"
SCRIPT = "script:examples/one_answer.json"
KEEL = "import sys; from keel.cli.app import main; sys.argv[0] = 'keel'; main()"
TARGETS = {"keel --help": 15.0, "keel run (scripted, one answer)": 30.0}


@dataclass
class Source:
    """One checkout's `src` folder, and the wall times of its commands over the rounds."""

    label: str
    path: Path
    times: dict[str, list[float]] = field(default_factory=dict)
    cpu: dict[str, list[float]] = field(default_factory=dict)


def commands(store: Path) -> dict[str, list[str]]:
    """The argument vectors measured, by the name the table shows."""
    python = sys.executable
    return {
        "bare (python -c pass)": [python, "-c", "pass"],
        "import keel": [python, "-c", "import keel"],
        "keel --help": [python, "-c", KEEL, "--help"],
        "keel run (scripted, one answer)": [
            *(python, "-c", KEEL, "run", QUESTION),
            *("--model", SCRIPT, "--repo", ".", "--store", str(store)),
        ],
    }


def timed(argv: list[str], src: Path) -> tuple[float, float]:
    """Wall and CPU (user + system) seconds of one process; a failing command stops the
    benchmark (no figure of it)."""
    env = {**os.environ, "PYTHONPATH": str(src), "NO_COLOR": "1"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"{argv[2:4]} exited {done.returncode}:\n{done.stderr.decode(errors='replace')}")
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return wall, cpu


def measure(sources: list[Source], rounds: int) -> None:
    """Interleave: every round runs every command of every source once."""
    for source in sources:
        compileall.compile_dir(source.path, quiet=1)
    with tempfile.TemporaryDirectory(prefix="keel-startup-") as tmp:
        for index in range(rounds + 1):  # round 0 is the warm-up
            for source in sources:
                store = Path(tmp) / f"{source.label}.db"
                for name, argv in commands(store).items():
                    wall, cpu = timed(argv, source.path)
                    if index:
                        source.times.setdefault(name, []).append(wall)
                        source.cpu.setdefault(name, []).append(cpu)


def table(sources: list[Source]) -> bool:
    """Print command, median s, x bare per source (wall time; CPU time beside it, which other
    load disturbs less); True when every target is met (on wall time)."""
    ok = True
    print(
        f"{'source':<8} {'command':<32} {'median s':>9} {'x bare':>7} {'cpu s':>7} "
        f"{'x bare':>7}  target (wall)"
    )
    for source in sources:
        bare = statistics.median(source.times["bare (python -c pass)"])
        bare_cpu = statistics.median(source.cpu["bare (python -c pass)"])
        for name, walls in source.times.items():
            median = statistics.median(walls)
            ratio = median / bare
            cpu = statistics.median(source.cpu[name])
            target = TARGETS.get(name)
            verdict = ""
            if target is not None:
                passed = ratio <= target
                ok = ok and passed
                verdict = f"<= {target:.0f}x {'PASS' if passed else 'FAIL'}"
            print(
                f"{source.label:<8} {name:<32} {median:>9.3f} {ratio:>7.1f} {cpu:>7.3f} "
                f"{cpu / bare_cpu:>7.1f}  {verdict}"
            )
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=15, help="measured rounds")
    parser.add_argument(
        "--src", action="append", default=[], help="LABEL=DIR or DIR: a checkout's src folder"
    )
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args()
    sources = []
    for given in args.src or [f"this={ROOT / 'src'}"]:
        label, _, path = given.rpartition("=")
        sources.append(Source(label or Path(path).parent.name, Path(path).resolve()))
    print(f"{os.cpu_count()} cores; load average before: {os.getloadavg()}")
    measure(sources, args.repeats)
    print(f"{args.repeats} rounds; load average after: {os.getloadavg()}")
    ok = table(sources)
    if args.check and not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
