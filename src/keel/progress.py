"""Progress lines on stderr while a run goes: a listener, outside the loop."""

from __future__ import annotations

from rich.console import Console

from keel.records import (
    Event,
    EvidenceReset,
    ModelErrorSeen,
    ModelRequestSent,
    ResultElided,
    RunCompleted,
    ToolCallRequested,
    ToolResultRecorded,
)
from keel.terminal import safe_text

__all__ = ["ProgressPrinter"]


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
                return f"{at} the answer was cut off at the model's output limit"
        return None
