"""One terminal, shared by the answer streamed to stdout and the progress written to stderr.

In a terminal both streams land on the same screen, and each writer used to act as if it had
the screen alone: the embedded model's spinner (a rich status on stderr) redraws its own line
with a carriage return and an erase, and the answer streamed onto that line was erased by the
next frame and never printed again (issue 45, 11 runs of 11); a progress line printed after
streamed text ran on at the end of the text's line. Every writer of a `keel run` goes through
one `Screen`, which keeps two rules under one lock:

- streamed text stops the spinner first, and no spinner starts again until a progress line
  has followed the text;
- a progress line first ends the open line of text, so each starts at the left margin.

A pipe is not a terminal: the console writes no spinner and no escape sequence there, and the
text written is exactly the text streamed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from rich.console import Console

__all__ = ["Screen"]


class Screen:
    """The run's terminal: `text` for stdout, `line` and the spinner for stderr's `console`."""

    def __init__(self, console: Console, write: Callable[[str], object] | None = None) -> None:
        self.console = console
        self._write = write
        self._lock = threading.RLock()
        self._open = False
        """Text was written to stdout since its last newline."""
        self._texted = False
        """Text was written since the last progress line: the spinner stays off."""
        self._status: Any = None

    def text(self, piece: str) -> None:
        """Streamed text, on stdout as it comes; the spinner, if any, is stopped first."""
        if not piece or self._write is None:
            return
        with self._lock:
            self._stop()
            self._write(piece)
            self._open = not piece.endswith("\n")
            self._texted = True

    def end_text(self) -> None:
        """End the open line of streamed text, if there is one."""
        with self._lock:
            if self._open and self._write is not None:
                self._write("\n")
            self._open = False

    def line(self, text: str, *, style: str | None = "dim") -> None:
        """One progress line on stderr, starting at the left margin (untrusted text must be
        made safe by the caller: it is printed without markup)."""
        with self._lock:
            self.end_text()
            self._texted = False
            self.console.print(
                text, highlight=False, markup=False, style=style, soft_wrap=True
            )

    def spin(self, message: str) -> None:
        """Show `message` on the spinner's line (a terminal only), unless text was streamed
        since the last progress line: then the text is the progress."""
        with self._lock:
            if self._texted or not self.console.is_terminal:
                return
            if self._status is None:
                self._status = self.console.status(message)
                self._status.start()
            else:
                self._status.update(message)

    def stop_spinning(self) -> None:
        with self._lock:
            self._stop()

    def _stop(self) -> None:
        if self._status is not None:
            status, self._status = self._status, None
            status.stop()  # transient: its line is erased, the cursor back at its start
