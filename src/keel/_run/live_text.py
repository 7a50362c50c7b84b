"""The run side of streaming text (ADR 0039): which attempts stream, and the discard marker.

Made only when someone listens for text and the transport can stream (`for_run`); otherwise
the turn calls the transport's `request` as before and nothing here exists, so a run nobody
listens to pays nothing for it. Deltas go to the text listeners only: they are not events of
the record, have no `seq`, and are neither saved nor counted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from keel._run.recorder import Listener
from keel.messages import ModelRequest, ModelResponse
from keel.records import Event
from keel.transports.base import Keyed, Transport
from keel.transports.policy import MIN_SECRET_LENGTH, REDACTED
from keel.transports.streaming import (
    OnText,
    Streams,
    TextDelta,
    TextDiscarded,
    TextEvent,
    TextListener,
)

__all__ = ["LiveText", "PerRun", "for_run"]


class RunTextListener(Protocol):
    """A text listener of one run that also hears the run's events (when to drop its text)."""

    def __call__(self, event: TextEvent) -> None: ...

    def heard(self, event: Event) -> None: ...


@runtime_checkable
class PerRun(Protocol):
    """A text listener that needs to know the run it hears (`keel.live_file.LiveFiles`)."""

    def for_run(self, run_id: str) -> RunTextListener: ...


def for_run(
    run_id: str, text_listeners: tuple[TextListener, ...]
) -> tuple[tuple[TextListener, ...], tuple[Listener, ...]]:
    """The run's text listeners, each `PerRun` one bound to `run_id`, and the event
    listeners those bound ones add."""
    text: list[TextListener] = []
    events: list[Listener] = []
    for listener in text_listeners:
        if isinstance(listener, PerRun):
            bound = listener.for_run(run_id)
            text.append(bound)
            events.append(bound.heard)
        else:
            text.append(listener)
    return tuple(text), tuple(events)


class LiveText:
    """Streams each model attempt of a run to its text listeners."""

    def __init__(self, transport: Streams, listeners: tuple[TextListener, ...]) -> None:
        self._transport = transport
        self._listeners = listeners
        self._streamed = False
        """The current attempt has handed out text."""
        secret = transport.secret() if isinstance(transport, Keyed) else None
        self._secret = secret if secret and len(secret) >= MIN_SECRET_LENGTH else None

    @classmethod
    def for_run(cls, transport: Transport, listeners: tuple[TextListener, ...]) -> LiveText | None:
        if not listeners or not isinstance(transport, Streams) or not transport.streams:
            return None
        return cls(transport, listeners)

    def attempt(self, step: int, attempt: int) -> Transport:
        """The transport for attempt `attempt` of step `step`: its text goes to the
        listeners as it arrives."""
        self._streamed = False
        held = ""

        def on_text(text: str) -> None:
            nonlocal held
            self._streamed = True
            if self._secret is not None:  # the key may come split across deltas
                text, held = _scrubbed(held + text, self._secret)
            if text:
                self._tell(TextDelta(text, step, attempt))

        def finished() -> None:
            nonlocal held
            if held:  # the answer ended: what was held was no key
                self._tell(TextDelta(held, step, attempt))
                held = ""

        return _Streamed(self._transport, on_text, finished)

    def failed(self, step: int, attempt: int) -> None:
        """The attempt failed: if it streamed text, the listeners are told to drop it."""
        if self._streamed:
            self._streamed = False
            self._tell(TextDiscarded(step, attempt))

    def _tell(self, event: TextEvent) -> None:
        for listener in self._listeners:
            try:
                listener(event)
            except Exception:  # a listener's failure never fails the run
                continue


def _scrubbed(text: str, secret: str) -> tuple[str, str]:
    """`text` with `secret` replaced, split into what may be shown now and what is held back:
    its longest end that could be where the secret begins."""
    text = text.replace(secret, REDACTED)
    for size in range(min(len(text), len(secret) - 1), 0, -1):
        if secret.startswith(text[-size:]):
            return text[:-size], text[-size:]
    return text, ""


class _Streamed:
    """A transport whose `request` streams (what the gateway calls for one attempt)."""

    def __init__(self, transport: Streams, on_text: OnText, finished: Callable[[], None]) -> None:
        self._transport = transport
        self._on_text = on_text
        self._finished = finished
        self.name: str = getattr(transport, "name", "model")

    async def request(self, request: ModelRequest) -> ModelResponse:
        response = await self._transport.request_streaming(request, self._on_text)
        self._finished()
        return response
