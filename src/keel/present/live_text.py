"""`keel run` on a terminal: the model's text printed as it is written (ADR 0039).

Each attempt's text goes to stdout as it arrives; a new turn starts a new line. When an
attempt fails after streaming, a line on stderr says its text stops there and the model is
asked again. At the end, the answer is not printed a second time when it is exactly what the
last turn streamed (`shown`); the summary line follows on stderr as always. Text is cleaned of
escape sequences like every other piece of model output shown on a terminal.
"""

from __future__ import annotations

from collections.abc import Callable

from keel.present.terminal import safe_text
from keel.transports.streaming import TextDelta, TextEvent

__all__ = ["TerminalText"]


class TerminalText:
    """A text listener writing to `write` (stdout); `note` takes a line for stderr."""

    def __init__(self, write: Callable[[str], object], note: Callable[[str], object]) -> None:
        self._write = write
        self._note = note
        self._turn: tuple[int, int] | None = None
        self._text: list[str] = []

    def __call__(self, event: TextEvent) -> None:
        if not isinstance(event, TextDelta):  # TextDiscarded
            if self._text:
                self._write("\n")
            self._note("(that attempt failed part-way; the model is asked again)")
            self._turn, self._text = None, []
            return
        turn = (event.step, event.attempt)
        if turn != self._turn:
            if self._text:
                self._write("\n")
            self._turn, self._text = turn, []
        self._text.append(event.text)
        self._write(safe_text(event.text))

    def shown(self, answer: str) -> bool:
        """Whether the last turn streamed exactly `answer` (then it ends its line here)."""
        if not self._text or "".join(self._text) != answer:
            if self._text:
                self._write("\n")
            return False
        self._write("\n")
        return True
