"""A command run under a pseudo-terminal and read as a person at that terminal reads it.

The command's stdout and stderr are both the pty's follower, as in a shell; every byte it writes
is fed to `pyte`, a terminal emulator, so cursor moves, line erases and carriage returns (rich's
spinner redraws its line with them) act as they do on a real screen. `Screen.lines` is what
stands on the screen when the command has ended: text a spinner frame erased is not there.
The screen is tall enough that nothing scrolls off in these tests.
"""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import termios
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyte

COLUMNS = 120
ROWS = 200


@dataclass
class Screen:
    lines: list[str]
    """Each row of the final screen, trailing blanks removed, empty rows at the end dropped."""
    raw: bytes
    """Every byte the command wrote, for a failing assertion's message."""
    returncode: int

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    def shows(self, passage: str) -> bool:
        """`passage` stands on the screen, white space (and the terminal's wrapping) aside."""
        return _squeezed(passage) in _squeezed("".join(self.lines))


def run_on_a_terminal(
    command: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    timeout: float = 300.0,
) -> Screen:
    """Run `command` with stdin, stdout and stderr on one pty of `COLUMNS` x `ROWS`, until it
    ends; the screen it leaves."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLUMNS, 0, 0))
    process = subprocess.Popen(
        list(command),
        stdin=follower,
        stdout=follower,
        stderr=follower,
        cwd=cwd,
        env={**env, "TERM": "xterm-256color", "COLUMNS": str(COLUMNS), "LINES": str(ROWS)},
        start_new_session=True,
    )
    os.close(follower)
    raw = _read_until_closed(leader, process, timeout)
    screen = pyte.Screen(COLUMNS, ROWS)
    stream = pyte.ByteStream(screen)
    stream.feed(raw)
    lines = [line.rstrip() for line in screen.display]
    while lines and not lines[-1]:
        lines.pop()
    return Screen(lines, raw, process.returncode)


def _read_until_closed(leader: int, process: subprocess.Popen[bytes], timeout: float) -> bytes:
    deadline = time.monotonic() + timeout
    chunks: list[bytes] = []
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                process.kill()
                raise TimeoutError(f"{process.args!r} ran past {timeout} s")
            if not select.select([leader], [], [], min(left, 1.0))[0]:
                continue
            try:
                data = os.read(leader, 65536)
            except OSError:  # EIO: every holder of the follower has closed it
                break
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(leader)
        process.wait(timeout=30)
    return b"".join(chunks)


def _squeezed(text: str) -> str:
    return "".join(text.split())
