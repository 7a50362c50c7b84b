"""`keel run` on a terminal: the model's text printed as it is written (ADR 0039).

Each attempt's text goes to stdout as it arrives, through the run's `Screen` (which keeps the
spinner and the progress lines off it); a new turn starts a new line. When an attempt fails
after streaming, a line on stderr says its text stops there and the model is asked again. At
the end, the answer is not printed a second time when it is exactly what the last turn
streamed (`shown`): it stands on the screen already; the summary line follows on stderr as
always. Text is cleaned of escape sequences like every other piece of model output shown on a
terminal.
"""

from __future__ import annotations

from keel.present.screen import Screen
from keel.present.terminal import safe_text
from keel.transports.streaming import TextDelta, TextEvent

__all__ = ["TerminalText"]


class TerminalText:
    """A text listener writing the model's text to the screen's stdout."""

    def __init__(self, screen: Screen) -> None:
        self._screen = screen
        self._turn: tuple[int, int] | None = None
        self._text: list[str] = []

    def __call__(self, event: TextEvent) -> None:
        if not isinstance(event, TextDelta):  # TextDiscarded
            self._screen.line("keel: (that attempt failed part-way; the model is asked again)",
                              style=None)  # fmt: skip
            self._turn, self._text = None, []
            return
        turn = (event.step, event.attempt)
        if turn != self._turn:
            self._screen.end_text()
            self._turn, self._text = turn, []
        self._text.append(event.text)
        self._screen.text(safe_text(event.text))

    def shown(self, answer: str) -> bool:
        """Whether the last turn streamed exactly `answer` (its line is ended here)."""
        self._screen.end_text()
        return bool(self._text) and "".join(self._text) == answer
