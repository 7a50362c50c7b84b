"""A big paused run for the web view's bounds: `keel ui`'s tests and benchmarks/ui_live.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

import keel


def paused_run(path: Path, steps: int, keys: int) -> tuple[str, int]:
    """A run of `steps` calls over `keys` distinct ones (each repeated, so the page draws its
    charts, and never tripping the breaker), then one that waits for approval, stored at
    `path`: (run id, events recorded)."""

    @keel.tool
    def note(topic: str) -> str:
        """Read a note."""
        return f"note on {topic}: " + "words of evidence " * 10

    @keel.tool(effect="side_effecting", requires_approval=True)
    def publish(text: str) -> str:
        """Publish the notes."""
        return "published"

    turns: list[dict[str, object]] = [
        {"tool_calls": [{"name": "note", "arguments": {"topic": f"t{i % keys}"}}]}
        for i in range(steps)
    ]
    turns.append({"tool_calls": [{"name": "publish", "arguments": {"text": "all"}}]})
    store = keel.Store(path)
    limits = keel.Limits(
        max_model_calls=steps + 5,
        max_tool_calls=steps + 5,
        context_tokens=20_000,
        loop_threshold=steps // keys + 2,
    )
    transport = keel.ScriptedTransport.from_dict({"turns": turns})
    agent = keel.Agent(transport, tools=[note, publish], limits=limits, store=store)
    try:
        result = asyncio.run(agent.arun("Read every note, then publish."))
        assert result.status == "awaiting_approval", result.status
        return result.run_id, len(store.events(result.run_id))
    finally:
        store.close()
