"""Helpers for run-loop tests: a scripted agent over real tools, and what it sent and stored."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

import keel
from keel.records import Event
from keel.transports.scripted import ScriptedTransport

E = TypeVar("E", bound=Event)


@dataclass
class Outcome:
    result: keel.RunResult
    transport: ScriptedTransport
    events: list[Event]
    store: keel.Store

    @property
    def requests(self) -> list[keel.ModelRequest]:
        return self.transport.requests

    def of_type(self, kind: type[E]) -> list[E]:
        return [e for e in self.events if isinstance(e, kind)]


def call(name: str, **arguments: Any) -> dict[str, Any]:
    """A scripted turn that asks for one tool call."""
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


def batch(*calls: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    return {"tool_calls": [{"name": n, "arguments": a} for n, a in calls]}


async def run_script(
    script: dict[str, Any],
    tools: list[Any],
    *,
    store: keel.Store | None = None,
    question: str = "What does the evidence say?",
    **limits: Any,
) -> Outcome:
    limits.setdefault("retry_base_delay", 0.001)
    limits.setdefault("retry_max_delay", 0.01)
    transport = ScriptedTransport.from_dict(script, record=True)
    db = store or keel.Store(":memory:")
    agent = keel.Agent(transport, tools=tools, limits=keel.Limits(**limits), store=db)
    result = await agent.arun(question)
    return Outcome(result, transport, db.events(result.run_id), db)
