"""The embedded model's text as it is generated (ADR 0039), for `LocalTransport`.

Generation runs in a worker thread; each new piece of decoded text is handed to the event loop
(`call_soon_threadsafe`), so the run's listeners hear it on their own thread, in order, before
the response itself. Only answer text streams: an output that begins like a call (`<` or `{`
after leading whitespace, when the turn may call tools) is held back whole, since it is markup
the transport parses, not text for a person. Bytes that end inside a UTF-8 character wait for
the rest; the pieces handed out concatenate to the text of the response.
"""

from __future__ import annotations

import asyncio
from typing import Any

from keel.transports.streaming import OnText

__all__ = ["Pieces"]


class Pieces:
    """Follows one generation's tokens and hands out its new text."""

    def __init__(self, on_text: OnText, loop: asyncio.AbstractEventLoop, may_call: bool) -> None:
        self._on_text = on_text
        self._loop = loop
        self._may_call = may_call
        self._sent = 0
        self._held = False
        """The output begins like a call: nothing of it streams."""

    def tokens(self, llama: Any, out: list[int]) -> None:
        """In the worker thread, after each token: hand out what is new since the last."""
        if self._held:
            return
        data: bytes = llama.detokenize(out, special=False)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:  # the last character is not complete yet
            text = data[: exc.start].decode("utf-8", "replace")
        if not self._sent:
            start = text.lstrip()[:1]
            if not start:
                return  # only whitespace so far: maybe a call still
            if self._may_call and start in "<{":
                self._held = True
                return
        self._hand(text)

    def finish(self, text: str) -> None:
        """The generation's final text: whatever of it was not handed out yet."""
        if not self._held and self._sent and len(text) > self._sent:
            self._hand(text)

    def _hand(self, text: str) -> None:
        piece = text[self._sent :]
        if piece:
            self._sent = len(text)
            self._loop.call_soon_threadsafe(self._on_text, piece)
