"""Hooks: an application's own policy on a run, before and after model and tool calls.

    class Allow:
        def before_tool_call(self, call):          # sync or async
            if call.name == "fetch" and not allowed(call.arguments["url"]):
                return keel.Deny("that host is not on the allow list")

    Agent(model, tools=..., hooks=[Allow()])

A hook is any object with some of these methods, each sync or async, each returning None (go
on) or a decision:

    before_model_call(request)       Replace(ModelRequest) | EndRun
    after_model_call(response)       Replace(ModelResponse) | EndRun
    before_tool_call(call)           Replace(arguments: dict) | Deny(reason) | EndRun
    after_tool_call(call, result)    Replace(text | ToolResult) | EndRun

`Deny` answers the call as a person's denial does (by the hook's class name, with the reason)
and nothing is dispatched; `EndRun` ends the run with the classified failure `EndedByHook`.
What a hook changed is recorded (a `hook_applied` event; the replaced response, arguments or
result are what the run records), so a resume replays it without calling the hook again for
a step already taken. A hook that raises, takes longer than `Agent(hook_timeout=...)` or
returns something else ends the step with `HookFailed`, never a traceback. No hook can give
tools to a synthesis-only turn: a replaced request keeps the turn's tool choice, and a
replaced response with tool calls in such a turn is refused (recorded, the model's kept).
See docs/adr/0052-decisions-and-hooks.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["POINTS", "Deny", "EndRun", "Hook", "HookDecision", "Hooks", "Replace"]

POINTS = ("before_model_call", "after_model_call", "before_tool_call", "after_tool_call")


@dataclass(frozen=True, slots=True)
class Replace:
    """Go on with `value` instead: another request, response, arguments (a dict) or result
    (its text, or a ToolResult)."""

    value: Any


@dataclass(frozen=True, slots=True)
class Deny:
    """Do not dispatch this tool call; the model is told `reason`, as after a person's
    denial (the denial is recorded by the hook's class name)."""

    reason: str


@dataclass(frozen=True, slots=True)
class EndRun:
    """End the run here with the classified failure `EndedByHook`, saying `reason`."""

    reason: str


HookDecision = Replace | Deny | EndRun


class Hook(Protocol):
    """Documentation only: a hook needs none of these methods, and may have any of them."""

    def before_model_call(self, request: Any) -> Any: ...

    def after_model_call(self, response: Any) -> Any: ...

    def before_tool_call(self, call: Any) -> Any: ...

    def after_tool_call(self, call: Any, result: Any) -> Any: ...


@dataclass(frozen=True, slots=True)
class Hooks:
    """The run's hooks and how long one call of one may take."""

    hooks: tuple[object, ...]
    timeout: float = 10.0

    @classmethod
    def of(cls, hooks: Sequence[object], timeout: float) -> Hooks | None:
        """None when no hook has any of the methods: nothing to call, nothing to pay for."""
        if not any(callable(getattr(h, p, None)) for h in hooks for p in POINTS):
            return None
        return cls(tuple(hooks), timeout)

    def at(self, point: str) -> list[tuple[str, Any]]:
        return [
            (type(h).__name__, method)
            for h in self.hooks
            if callable(method := getattr(h, point, None))
        ]
