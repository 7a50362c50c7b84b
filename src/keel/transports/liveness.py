"""How a transport tells the gateway that its model is still writing (issue 39).

`Limits.model_timeout` bounds one model call. For a call whose transport says nothing, it is
the whole call, from sending to the answer, as before. A transport that reports each token it
receives (`Liveness.token`, from any thread) is timed by silence instead: the call times out
only when no token came for `model_timeout` seconds (the run's deadline still bounds the whole
call). On a busy 2-core machine the embedded model's synthesis answer was discarded 151 tokens
in by the 600 s timeout and asked for again from nothing, so after 48 minutes there was no
answer; a model writing a token every few seconds is slow, not stuck.

What the transport reports as its answer so far (`token`'s ``answer``: the text, when the
output is an answer and not a call) is what a call that does time out keeps: the gateway
returns it as a response whose `stop_reason` is ``"timeout"``, which counts as cut off
(`keel.messages.CUT_OFF_REASONS`), so the run ends with it, marked cut off, instead of
throwing it away.

The gateway opens one `Liveness` per attempt and makes it `current()` for the attempt's task
(a context variable, which ``asyncio.to_thread`` carries into the worker thread); a transport
that does not call it loses nothing.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable

__all__ = ["Liveness", "closed", "current", "opened"]


class Liveness:
    """One model call's signs of life: tokens so far, the latest one's time, the answer so far."""

    def __init__(self, on_token: Callable[[], None] | None = None) -> None:
        """`on_token` is called (from the reporting thread) after every `token`; the gateway
        uses it to move its timeout. It must be quick and thread-safe."""
        self._lock = threading.Lock()
        self._on_token = on_token
        self.tokens = 0
        """Output tokens reported so far."""
        self.prompt_tokens = 0
        """The prompt's tokens, when the transport knows them (`started`)."""
        self.last: float | None = None
        """`time.monotonic()` of the latest token, None before the first."""
        self.answer = ""
        """The answer's text so far; empty while the output is a call (nothing to keep)."""

    def started(self, prompt_tokens: int) -> None:
        """The prompt is being evaluated: how many tokens it has (for the kept answer's usage)."""
        with self._lock:
            self.prompt_tokens = prompt_tokens

    def token(self, count: int, answer: str | None = None) -> None:
        """Another output token: `count` so far and, when the output is an answer, its text so
        far. Thread-safe; cheap."""
        with self._lock:
            self.tokens = count
            self.last = time.monotonic()
            if answer is not None:
                self.answer = answer
        if self._on_token is not None:
            self._on_token()

    def kept(self) -> str | None:
        """The answer a timed-out call keeps: the text written so far, or None when there is
        none (no token yet, or the output was a call)."""
        with self._lock:
            text = self.answer.strip()
        return text or None


_CURRENT: contextvars.ContextVar[Liveness | None] = contextvars.ContextVar(
    "keel_liveness", default=None
)


def current() -> Liveness | None:
    """The `Liveness` of the model call this code runs in, or None outside the gateway."""
    return _CURRENT.get()


def opened(liveness: Liveness) -> contextvars.Token[Liveness | None]:
    """Make `liveness` current for this task (the gateway, around one attempt)."""
    return _CURRENT.set(liveness)


def closed(token: contextvars.Token[Liveness | None]) -> None:
    """Undo `opened`."""
    _CURRENT.reset(token)
