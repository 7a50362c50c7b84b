"""Progress lines on stderr while a run goes: listeners, outside the loop.

`ProgressPrinter` prints one short line per meaningful event. `TokenMeter` watches the embedded
model, whose turns take seconds to minutes on a CPU: on a terminal a status line shows the step
and the tokens written so far with their rate while the model generates, and after each turn one
line says how many tokens it took, how fast, and how much of the prompt came from the cache.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from rich.console import Console

from keel.present.terminal import safe_text
from keel.records import (
    Event,
    EvidenceReset,
    ModelErrorSeen,
    ModelRequestSent,
    ModelResponseReceived,
    ResultElided,
    RunCancelled,
    RunCompleted,
    RunFailed,
    ToolCallRequested,
    ToolResultRecorded,
)

if TYPE_CHECKING:
    from keel.agent import Agent

__all__ = ["ProgressPrinter", "TokenMeter", "watch_local_model"]


def watch_local_model(agent: Agent, console: Console) -> None:
    """Show the embedded model's progress when `agent` runs on it; otherwise do nothing."""
    if "keel.transports.local.transport" not in sys.modules:
        return  # no LocalTransport exists before its module is imported: spare others the import
    from keel.transports.local import LocalTransport

    if isinstance(agent.transport, LocalTransport):
        meter = TokenMeter(console)
        agent.transport.on_tokens = meter.tokens
        agent.listeners = (*agent.listeners, meter)


class TokenMeter:
    """A listener (model turns) and the local transport's token callback (from its thread)."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._lock = threading.Lock()
        self._status: Any = None
        self._step = 0
        self._started = 0.0
        self._written = (0, 0.0)
        """The last callback's (tokens, seconds since the first token)."""

    def __call__(self, event: Event) -> None:
        match event:
            case ModelRequestSent():
                self._begin(event.step)
            case ModelResponseReceived():
                self._end()
                line = self._turn_line(event)
                self.console.print(line, highlight=False, markup=False, style="dim", soft_wrap=True)
            case ModelErrorSeen() | RunCompleted() | RunFailed() | RunCancelled():
                self._end()

    def tokens(self, count: int, seconds: float) -> None:
        """After each token, from the generation's thread."""
        with self._lock:
            self._written = (count, seconds)
            if self._status is not None:
                rate = f", {(count - 1) / seconds:.1f} tokens/s" if seconds > 0 else ""
                self._status.update(f"[{self._step}] model: {count} tokens{rate}")

    def _begin(self, step: int) -> None:
        with self._lock:
            self._step, self._started, self._written = step, time.monotonic(), (0, 0.0)
            if self.console.is_terminal and self._status is None:
                self._status = self.console.status(f"[{step}] model: reading the prompt")
                self._status.start()

    def _end(self) -> None:
        with self._lock:
            if self._status is not None:
                self._status.stop()
                self._status = None

    def _turn_line(self, event: ModelResponseReceived) -> str:
        """Prompt and generation apart: the prompt's time is what came before the first token."""
        total = time.monotonic() - self._started
        count, writing = self._written
        usage = event.usage
        rate = f" at {(count - 1) / writing:.1f} tokens/s" if count > 1 and writing > 0 else ""
        return (
            f"[{event.step}] model: prompt {usage.input_tokens} tokens "
            f"({usage.cached_input_tokens} from the cache) in {total - writing:.1f}s; "
            f"wrote {usage.output_tokens} tokens{rate}"
        )


class ProgressPrinter:
    """Prints one short line per meaningful event; subscribes, never steers."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def __call__(self, event: Event) -> None:
        line = self._line(event)
        if line:
            self.console.print(safe_text(line), highlight=False, markup=False, style="dim")

    @staticmethod
    def _line(event: Event) -> str | None:
        at = f"[{event.step}]"
        match event:
            case ModelRequestSent(synthesis=str(reason)):
                return f"{at} synthesis-only turn ({reason}): asking for the answer"
            case ToolCallRequested():
                return f"{at} {event.call_key[:100]}"
            case ToolResultRecorded(is_error=True):
                return f"{at}   error: {event.content[:100]}"
            case ModelErrorSeen():
                retry = f", retrying in {event.retry_in:.1f}s" if event.retry_in else ""
                return f"{at} model error: {event.message[:100]}{retry}"
            case EvidenceReset():
                return f"{at} page changed, counter reset: {event.call_key[:80]}"
            case ResultElided():
                return f"{at} elided an old result to save context ({event.size} chars)"
            case RunCompleted(cut_off=True):
                return f"{at} the answer was cut off at the model's output limit or by its timeout"
        return None
