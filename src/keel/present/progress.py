"""Progress lines on stderr while a run goes: listeners, outside the loop.

`ProgressPrinter` prints one short line per meaningful event. `TokenMeter` watches the embedded
model, whose turns take seconds to minutes on a CPU: before the run a line says the model is
loading and how big it is (the load took 8.7 s in silence, issue 45), on a terminal a status
line shows the step and the tokens written so far with their rate while the model generates,
and after each turn one line says how many tokens it took, how fast, and how much of the prompt
came from the cache. Both write through the run's `Screen`, so neither runs over the answer.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from keel.present.screen import Screen
from keel.present.terminal import safe_text
from keel.records import (
    Event,
    EvidenceReset,
    HostedToolCalled,
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
    from keel.transports.local import LocalTransport

__all__ = ["ProgressPrinter", "TokenMeter", "loading_line", "watch_local_model"]


def watch_local_model(agent: Agent, screen: Screen) -> None:
    """Show the embedded model's progress when `agent` runs on it; otherwise do nothing."""
    if "keel.transports.local.transport" not in sys.modules:
        return  # no LocalTransport exists before its module is imported: spare others the import
    from keel.transports.local import LocalTransport

    if isinstance(agent.transport, LocalTransport):
        meter = TokenMeter(screen, agent.transport)
        agent.transport.on_tokens = meter.tokens
        agent.listeners = (*agent.listeners, meter)
        if agent.transport.load_seconds is None:  # loaded before the first step, in silence
            screen.line(loading_line(agent.transport))


def loading_line(transport: LocalTransport) -> str:
    """``loading the embedded model Qwen2.5-Coder 1.5B Instruct, Q4_K_M (1.1 GB) ...``."""
    from keel.transports.local.weights import MODELS

    if transport.model_path is None:
        shipped = MODELS[transport.model]
        what, size = shipped.label, shipped.size
    else:
        what = safe_text(transport.model_path)
        try:
            size = Path(transport.model_path).stat().st_size
        except OSError:
            return f"loading the embedded model {what} ..."
    shown = f"{size / 1e9:.1f} GB" if size >= 1e9 else f"{size / 1e6:.0f} MB"
    return f"loading the embedded model {what} ({shown}) ..."


class TokenMeter:
    """A listener (model turns) and the local transport's token callback (from its thread)."""

    def __init__(self, screen: Screen, transport: LocalTransport | None = None) -> None:
        self.screen = screen
        self._transport = transport
        self._load_told = False
        self._lock = threading.Lock()
        self._step = 0
        self._started = 0.0
        self._written = (0, 0.0)
        """The last callback's (tokens, seconds since the first token)."""

    def __call__(self, event: Event) -> None:
        match event:
            case ModelRequestSent():
                self._begin(event.step)
            case ModelResponseReceived():
                self.screen.stop_spinning()
                self.screen.line(self._turn_line(event))
            case ModelErrorSeen() | RunCompleted() | RunFailed() | RunCancelled():
                self.screen.stop_spinning()

    def tokens(self, count: int, seconds: float) -> None:
        """After each token, from the generation's thread."""
        with self._lock:
            self._written = (count, seconds)
            step = self._step
        rate = f", {(count - 1) / seconds:.1f} tokens/s" if seconds > 0 else ""
        self.screen.spin(f"[{step}] model: {count} tokens{rate}")

    def _begin(self, step: int) -> None:
        loaded = self._transport.load_seconds if self._transport is not None else None
        if loaded is not None and not self._load_told:
            self._load_told = True
            self.screen.line(f"[{step}] model loaded in {loaded:.1f}s")
        with self._lock:
            self._step, self._started, self._written = step, time.monotonic(), (0, 0.0)
        self.screen.spin(f"[{step}] model: reading the prompt")

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

    def __init__(self, screen: Screen) -> None:
        self.screen = screen

    def __call__(self, event: Event) -> None:
        line = self._line(event)
        if line:
            self.screen.line(safe_text(line))

    @staticmethod
    def _line(event: Event) -> str | None:
        at = f"[{event.step}]"
        match event:
            case ModelRequestSent(synthesis=str(reason)):
                return f"{at} synthesis-only turn ({reason}): asking for the answer"
            case ToolCallRequested():
                return f"{at} {event.call_key[:100]}"
            case HostedToolCalled():
                asked = event.input.replace("\n", " | ")[:80]
                found = f"{len(event.sources)} sources"
                return f"{at} {event.name} (by the provider) {asked!r}: {event.error or found}"
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
