"""Progress lines on stderr while a run goes: a listener, outside the loop."""

from __future__ import annotations

from typing import Any

from rich.console import Console


class ProgressPrinter:
    """Prints one short line per meaningful event; subscribes, never steers."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def __call__(self, type_: str, data: dict[str, Any]) -> None:
        line = self._line(type_, data)
        if line:
            self.console.print(line, highlight=False, markup=False, style="dim")

    @staticmethod
    def _line(type_: str, data: dict[str, Any]) -> str | None:
        step = data.get("step")
        if type_ == "model_request" and data["synthesis"]:
            return f"[{step}] synthesis-only turn ({data['synthesis']}): asking for the answer"
        if type_ == "tool_call":
            return f"[{step}] {data['call_key'][:100]}"
        if type_ == "tool_result" and data["is_error"]:
            return f"[{step}]   error: {data['content'][:100]}"
        if type_ == "model_error":
            retry = f", retrying in {data['retry_in']:.1f}s" if data["retry_in"] else ""
            return f"[{step}] model error: {data['message'][:100]}{retry}"
        if type_ == "evidence_reset":
            return f"[{step}] page changed, counter reset: {data['call_key'][:80]}"
        if type_ == "result_elided":
            return f"[{step}] elided an old result to save context ({data['size']} chars)"
        return None
