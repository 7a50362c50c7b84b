"""One step of `make`'s install, run quietly: every line the command prints goes to a log file,
and the terminal gets what a person installing Keel needs (issue 37).

    python scripts/install_step.py --log .venv/install.log --step "installing X" \\
        [--watch 'GLOB' --watch-label "of the model"] -- pip install ...

What the terminal gets, line by line (`Lines.feed`):

- noise, kept in the log only: pip's `Link requires a different Python` (a dozen under
  `--verbose`, each a release pip skipped), `WARNING: Location '...' is ignored` (an index
  folder of pip's configuration that does not exist), a build dependency's `does not provide
  the extra`, and CMake's developer warnings, whole blocks from `CMake Warning (dev)` to `This
  warning is for project developers`: they are for llama.cpp's developers and look like
  failures to anyone else;
- problems, always: `ERROR`, `error:`, `CMake Error`, `Traceback`, and pip's other warnings;
- steps, always: what pip installs (`Installing collected packages`, `Successfully
  installed`, a wheel built), scikit-build's phases (`*** Building project with Ninja...`), a
  download of 20 MB or more;
- progress, at most one line every few seconds: CMake's `[12/83] Building CXX object ...`,
  pip's `Collecting`, `Downloading`, `Processing`, `Using cached`;
- the rest (pip's and CMake's details), the log only.

When nothing was shown for a while (`--quiet-after`, 10 s), a line says the step still runs,
for how long, what it last printed and, with `--watch`, how many MB the files matching the
glob hold so far (the model's six packages while pip unpacks them: 74 s of silence before).
The step's own exit code is this script's; on a failure the terminal gets the last lines of
the output and the log's path. Standard library only: it runs before anything is installed.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import os
import re
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Literal, TextIO

Kind = Literal["noise", "problem", "step", "progress", "detail"]

NOISE = re.compile(
    r"^\s*(Link requires a different Python"
    r"|WARNING: Location '[^']*' is ignored: it is neither a file nor a directory"
    r"|WARNING: \S+ \S+ does not provide the extra )"
)
CMAKE_DEV_START = re.compile(r"^\s*CMake Warning \(dev\)")
CMAKE_DEV_END = re.compile(r"This warning is for project developers")
PROBLEM = re.compile(r"(^\s*ERROR\b|\berror:|^\s*CMake Error|^\s*Traceback|^\s*WARNING:)")
STEP = re.compile(
    r"^(Installing collected packages|Successfully installed|Successfully built"
    r"|Building wheels for collected packages)"
    r"|^\s{0,2}(Building wheel for \S+ \(.*\): (started|finished)|Created wheel for"
    r"|\*\*\* (Configuring CMake|Building project|Installing project))"
)
PROGRESS = re.compile(
    r"^\s*\[\d+/\d+\] |^(Collecting|Processing) |^\s{0,2}(Downloading|Using cached) "
)
BIG_DOWNLOAD = re.compile(r"^\s{0,2}Downloading \S+ \((\d+(?:\.\d+)?) MB\)")
BIG_MB = 20.0
WIDTH = 110
"""A shown line is cut to this many characters (pip's package lists run to thousands)."""


def kind(line: str) -> Kind:
    """What one line of pip's or CMake's output is (a CMake block is `Lines`' business)."""
    if NOISE.search(line):
        return "noise"
    if PROBLEM.search(line):
        return "problem"
    big = BIG_DOWNLOAD.search(line)
    if STEP.search(line) or (big is not None and float(big.group(1)) >= BIG_MB):
        return "step"
    if PROGRESS.search(line):
        return "progress"
    return "detail"


def cut(line: str, width: int = WIDTH) -> str:
    line = line.rstrip()
    return line if len(line) <= width else line[: width - 3] + "..."


class Lines:
    """The filter: each line in, what the terminal shows of it out. Progress is thinned to
    one line every `every` seconds; a CMake developer warning is dropped whole."""

    def __init__(self, every: float = 3.0) -> None:
        self.every = every
        self.in_cmake_dev = False
        self.last_progress = float("-inf")
        self.noise = 0

    def feed(self, line: str, now: float) -> str | None:
        """The line as the terminal shows it, or None when it is for the log only."""
        if self.in_cmake_dev or CMAKE_DEV_START.search(line):
            self.in_cmake_dev = not CMAKE_DEV_END.search(line)
            self.noise += 1
            return None
        found = kind(line)
        if found == "noise":
            self.noise += 1
            return None
        if found == "progress":
            if now - self.last_progress < self.every:
                return None
            self.last_progress = now
        elif found == "detail":
            return None
        return cut(line)


def megabytes(pattern: str) -> float:
    """How many MB the files under the paths matching `pattern` hold."""
    total = 0
    for root in glob.glob(pattern):
        for folder, _, names in os.walk(root):
            for name in names:
                with contextlib.suppress(OSError):  # a file pip moved meanwhile
                    total += os.lstat(os.path.join(folder, name)).st_size
    return total / 1e6


def took(seconds: float) -> str:
    minutes, rest = divmod(int(seconds), 60)
    return f"{minutes} min {rest} s" if minutes else f"{rest} s"


class Step:
    """One command run under the filter, its whole output appended to the log."""

    def __init__(self, args: argparse.Namespace, out: TextIO) -> None:
        self.args = args
        self.out = out
        self.lines = Lines(args.every)
        self.lock = threading.Lock()
        self.started = self.last_shown = time.monotonic()
        self.last_line = ""
        self.tail: deque[str] = deque(maxlen=args.tail)
        self.done = threading.Event()

    def show(self, text: str) -> None:
        with self.lock:
            print(text, file=self.out, flush=True)
            self.last_shown = time.monotonic()

    def heartbeat(self) -> None:
        """Every second: when nothing was shown for `quiet_after` seconds, say so."""
        while not self.done.wait(1.0):
            now = time.monotonic()
            if now - self.last_shown < self.args.quiet_after:
                continue
            said = f"keel: {self.args.step}: still running, {took(now - self.started)}"
            if self.args.watch:
                said += f", {megabytes(self.args.watch):.0f} MB {self.args.watch_label} in place"
            if self.last_line:
                said += f" (last: {cut(self.last_line.strip(), 60)})"
            self.show(said)

    def run(self, command: Sequence[str]) -> int:
        log_path = Path(self.args.log)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.show(f"keel: {self.args.step} (all of pip's and CMake's output: {log_path})")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # pip's lines as it prints them
        with log_path.open("a", encoding="utf-8") as log:
            log.write(f"\n== {self.args.step}: {' '.join(command)}\n")
            beat = threading.Thread(target=self.heartbeat, daemon=True)
            beat.start()
            try:
                code = self._pump(command, env, log)
            finally:
                self.done.set()
                beat.join()
            log.write(f"== exit {code}\n")
        return self._close(code, log_path)

    def _pump(self, command: Sequence[str], env: dict[str, str], log: TextIO) -> int:
        process = subprocess.Popen(
            list(command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
            text=True, errors="replace", bufsize=1,
        )  # fmt: skip
        assert process.stdout is not None
        for line in process.stdout:
            log.write(line)
            if line.strip():
                self.last_line = line
                self.tail.append(line.rstrip())
            shown = self.lines.feed(line, time.monotonic())
            if shown is not None:
                self.show(shown)
        return process.wait()

    def _close(self, code: int, log_path: Path) -> int:
        spent = took(time.monotonic() - self.started)
        if code == 0:
            noise = self.lines.noise
            hidden = f"; {noise} lines of noise left in the log" if noise else ""
            self.show(f"keel: {self.args.step}: done in {spent}{hidden}")
            return 0
        self.show(f"keel: {self.args.step} failed (exit {code}) after {spent}; its last lines:")
        for line in self.tail:
            self.show(f"  {cut(line, WIDTH + 20)}")
        self.show(f"keel: all of its output: {log_path}")
        return code


def parser() -> argparse.ArgumentParser:
    made = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    made.add_argument("--log", required=True, help="the file every line is appended to")
    made.add_argument("--step", required=True, help="what the step does, as the user reads it")
    made.add_argument("--watch", default="", help="a glob whose files' MB show progress")
    made.add_argument("--watch-label", default="", help="what the watched files are")
    made.add_argument("--quiet-after", type=float, default=10.0, help="seconds of silence")
    made.add_argument("--every", type=float, default=3.0, help="seconds between progress lines")
    made.add_argument("--tail", type=int, default=30, help="lines shown when the step fails")
    made.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    return made


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    args = parser().parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser().error("no command given (after --)")
    return Step(args, out or sys.stdout).run(command)


if __name__ == "__main__":
    sys.exit(main())
