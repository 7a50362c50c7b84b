"""Calling an application's hooks (keel/hooks.py) at the four points of a run, and recording
what they changed (ADR 0052).

    before_model(parts, request, synthesis) -> request     before each model attempt
    after_model(parts, response, synthesis) -> response    on each answered attempt
    before_tools(parts, batch)                             on the open calls, once per call
    after_tool(parts, item) -> item                        on each call that ran

Hooks run in the order given, each seeing what the one before it made. A hook's change is an
event (`hook_applied`) and, for the two that shape what is recorded anyway (a response, a
result), the record holds the changed value; a `before_tool_call` decision is also kept in
`RunState.hooked` until its batch is answered, so a resumed batch applies it without asking
the hook again. A hook that raises, overruns its timeout or returns something that is not a
decision it may make fails the step with HookFailed; `EndRun` fails it with EndedByHook. The
synthesis rule is not theirs: a synthesis-only turn's request keeps its tool choice, and a
response with tool calls in such a turn is refused (the model's response is kept).

Hooks are bounded like tools (ADR 0062): each call runs as a task of its own, a sync hook in a
daemon thread that is abandoned at the timeout (never one `asyncio.run` joins at exit), an
async hook that swallows its cancellation closed where it waits; whatever a hook raises,
BaseException included, is HookFailed; and what it returns must be what the run can record:
arguments that are JSON, a reason and a text that are text; a lone surrogate in what it
returns is replaced where it enters (keel/inbound.py), as in a model's answer.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
from dataclasses import replace
from typing import Any, Protocol

from keel._run import decisions
from keel._run.parts import StepParts
from keel.errors import EndedByHook, HookFailed
from keel.hooks import Deny, EndRun, Hooks, Replace
from keel.inbound import clean_response, clean_text, clean_value
from keel.messages import ModelRequest, ModelResponse, ToolCall, ToolResult, digest_text
from keel.records import Decision, HookApplied, HookChange, JsonValue
from keel.tools.executor import Closing, ExecutedCall, stop_abandoning
from keel.tools.threads import run_in_daemon_thread

__all__ = ["after_model", "after_tool", "before_model", "before_tools"]


class _Batch(Protocol):  # keel._run.batch.Batch, which imports this module
    calls: list[ToolCall]
    journaled: set[str]

    def open_calls(self) -> list[ToolCall]: ...


class _Raised:
    """What a hook raised, handed back as a value: nothing a hook raises leaves its task."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


def _guarded(method: Any, *args: Any) -> Any:
    """A sync hook, in its daemon thread: what it returned, or what it raised as `_Raised`."""
    try:
        return method(*args)
    except BaseException as exc:
        return _Raised(exc)


async def _contained(method: Any, args: tuple[Any, ...], closing: Closing) -> Any:
    """The hook's outcome, or `_Raised`: only this task's own cancellation goes on as one,
    and a GeneratorExit only when `stop_abandoning` closed the coroutine."""
    try:
        if inspect.iscoroutinefunction(method):
            return await method(*args)
        outcome = await run_in_daemon_thread(functools.partial(_guarded, method, *args))
        return await outcome if inspect.isawaitable(outcome) else outcome
    except asyncio.CancelledError as exc:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise
        return _Raised(exc)
    except GeneratorExit as exc:
        if closing.closed:
            raise
        return _Raised(exc)
    except BaseException as exc:
        return _Raised(exc)


async def _call(
    parts: StepParts, hooks: Hooks, name: str, point: str, method: Any, *args: Any
) -> Any:
    """One hook method, sync (in a daemon thread) or async, as a task of its own within the
    timeout, abandoned past it; what it returned, or HookFailed."""
    details: dict[str, JsonValue] = {"hook": name, "point": point}
    closing = Closing()
    work = asyncio.ensure_future(_contained(method, args, closing))
    try:
        await asyncio.wait((work,), timeout=hooks.timeout)
    except asyncio.CancelledError:  # the run is cancelled: so is the hook
        await stop_abandoning(work, closing)
        raise
    if not work.done():
        await stop_abandoning(work, closing)
        raise HookFailed(
            f"the hook {name}.{point} did not return within {hooks.timeout:g}s",
            step=parts.state.step,
            details={**details, "timeout": hooks.timeout},
        )
    outcome = work.result()
    if isinstance(outcome, _Raised):
        error = outcome.error
        raise HookFailed(
            f"the hook {name}.{point} raised {type(error).__name__}: {str(error)[:500]}",
            step=parts.state.step,
            details={**details, "error": type(error).__name__},
        )
    if outcome is not None and not isinstance(outcome, Replace | Deny | EndRun):
        raise HookFailed(
            f"the hook {name}.{point} returned {type(outcome).__name__}, not None or a "
            "keel.Replace, keel.Deny or keel.EndRun",
            step=parts.state.step,
            details=details,
        )
    if isinstance(outcome, Deny | EndRun) and not isinstance(outcome.reason, str):
        kind = type(outcome).__name__
        raise HookFailed(
            f"the hook {name}.{point} returned a {kind} whose reason is "
            f"{type(outcome.reason).__name__}, not text",
            step=parts.state.step,
            details=details,
        )
    return _cleaned(outcome)


def _cleaned(outcome: Any) -> Any:
    """What a hook returned, with any lone surrogate in its text replaced (U+FFFD)."""
    if isinstance(outcome, Deny | EndRun):
        return replace(outcome, reason=clean_text(outcome.reason))
    if not isinstance(outcome, Replace):
        return outcome
    value = outcome.value
    if isinstance(value, ModelResponse) and isinstance(value.text, str | None):
        return Replace(clean_response(value))
    if isinstance(value, ToolResult) and isinstance(value.content, str):
        return Replace(replace(value, content=clean_text(value.content)))
    if isinstance(value, str | dict):
        return Replace(clean_value(value))
    return outcome


def _not_json(value: Any) -> str | None:
    """Why `value` cannot be recorded as JSON (a non-finite number is not JSON either)."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        return str(exc)[:200]
    return None


def _ended(parts: StepParts, name: str, point: str, end: EndRun, call: str | None) -> EndedByHook:
    _emit(parts, name, point, "end_run", end.reason, call)
    return EndedByHook(
        f"the hook {name}.{point} ended the run: {end.reason}",
        step=parts.state.step,
        details={"hook": name, "point": point},
    )


def _refuse(parts: StepParts, name: str, point: str, outcome: object, allowed: str) -> HookFailed:
    return HookFailed(
        f"the hook {name}.{point} returned {type(outcome).__name__}, which it may not: {allowed}",
        step=parts.state.step,
        details={"hook": name, "point": point},
    )


def _emit(
    parts: StepParts, name: str, point: str, action: str, detail: JsonValue, call: str | None
) -> None:
    parts.recorder.emit(
        HookApplied(
            step=parts.state.step,
            hook=name,
            point=point,
            action=action,
            call_id=call,
            detail=detail,
        )
    )


# -- model calls -------------------------------------------------------------------------------


async def before_model(parts: StepParts, request: ModelRequest, synthesis: bool) -> ModelRequest:
    hooks = parts.hooks
    if hooks is None:
        return request
    point = "before_model_call"
    for name, method in hooks.at(point):
        outcome = await _call(parts, hooks, name, point, method, request)
        if isinstance(outcome, EndRun):
            raise _ended(parts, name, point, outcome, None)
        if isinstance(outcome, Deny):
            raise _refuse(parts, name, point, outcome, "a model call is replaced or the run ended")
        if outcome is None:
            continue
        if not isinstance(outcome.value, ModelRequest):
            raise _refuse(parts, name, point, outcome.value, "Replace takes a ModelRequest here")
        changed: ModelRequest = outcome.value
        if synthesis and (
            changed.tool_choice != request.tool_choice or changed.tools != request.tools
        ):  # the synthesis rule is not a hook's: the turn stays tool-free
            _emit(parts, name, point, "refused", "tools in a synthesis-only turn", None)
            changed = replace(changed, tool_choice=request.tool_choice, tools=request.tools)
        _emit(parts, name, point, "replace", {"items": len(changed.items)}, None)
        request = changed
    return request


async def after_model(parts: StepParts, response: ModelResponse, synthesis: bool) -> ModelResponse:
    """The response the run records and acts on; the usage stays the provider's."""
    hooks = parts.hooks
    if hooks is None:
        return response
    point = "after_model_call"
    for name, method in hooks.at(point):
        outcome = await _call(parts, hooks, name, point, method, response)
        if isinstance(outcome, EndRun):
            raise _ended(parts, name, point, outcome, None)
        if isinstance(outcome, Deny):
            raise _refuse(parts, name, point, outcome, "a response is replaced or the run ended")
        if outcome is None:
            continue
        if not isinstance(outcome.value, ModelResponse):
            raise _refuse(parts, name, point, outcome.value, "Replace takes a ModelResponse here")
        changed: ModelResponse = outcome.value
        if changed.text is not None and not isinstance(changed.text, str):
            wanted = "a replaced response's text is text or None"
            raise _refuse(parts, name, point, changed.text, wanted)
        if synthesis and changed.tool_calls:  # never tools in a synthesis-only turn
            calls = [c.name for c in changed.tool_calls]
            _emit(parts, name, point, "refused", {"tool_calls": list[JsonValue](calls)}, None)
            continue
        detail: JsonValue = {
            "text_before": response.text,
            "calls_before": [c.key for c in response.tool_calls],
        }
        _emit(parts, name, point, "replace", detail, None)
        response = replace(changed, usage=response.usage)
    return response


# -- tool calls --------------------------------------------------------------------------------


async def before_tools(parts: StepParts, batch: _Batch) -> None:
    """Each open call that has not met the hooks yet meets them; what they decided is kept
    (`RunState.hooked`) and applied again, without them, to a resumed batch."""
    hooks, state = parts.hooks, parts.state
    for index, call in enumerate(batch.calls):
        if call.id not in {c.id for c in batch.open_calls()} or call.id in batch.journaled:
            continue
        change = state.hooked.get(call.id)
        if change is None and hooks is not None:
            change = await _ask(parts, hooks, call)
            state.hooked[call.id] = change
        if change is None:
            continue
        if change.action == "replace":
            runs = decisions.with_arguments(call, change.arguments)
            decisions.rekey(parts, call, runs)
            batch.calls[index] = runs
        elif change.action == "deny" and call.id not in state.decisions:
            state.decisions[call.id] = Decision(
                False, change.hook, change.reason, name=call.name, call_key=call.key
            )


async def _ask(parts: StepParts, hooks: Hooks, call: ToolCall) -> HookChange:
    point = "before_tool_call"
    current = call
    change = HookChange("", "pass")
    for name, method in hooks.at(point):
        outcome = await _call(parts, hooks, name, point, method, current)
        if isinstance(outcome, EndRun):
            raise _ended(parts, name, point, outcome, call.id)
        if isinstance(outcome, Deny):
            _emit(parts, name, point, "deny", outcome.reason, call.id)
            return HookChange(name, "deny", reason=str(outcome.reason))
        if outcome is None:
            continue
        if not isinstance(outcome.value, dict):
            wanted = "Replace takes the whole arguments (a dict)"
            raise _refuse(parts, name, point, outcome.value, wanted)
        why = _not_json(outcome.value)
        if why is not None:
            raise _refuse(parts, name, point, outcome.value, f"arguments that are not JSON ({why})")
        arguments = outcome.value
        _emit(parts, name, point, "replace", arguments, call.id)
        current = decisions.with_arguments(current, arguments)
        change = HookChange(name, "replace", arguments=arguments)
    return change


async def after_tool(parts: StepParts, item: ExecutedCall) -> ExecutedCall:
    """A call that ran, with its result as the hooks left it: a replaced result is what the
    model reads and the store keeps (the tool's whole text is then not kept)."""
    hooks = parts.hooks
    if hooks is None or not item.dispatched:
        return item
    point = "after_tool_call"
    for name, method in hooks.at(point):
        outcome = await _call(parts, hooks, name, point, method, item.call, item.result)
        if isinstance(outcome, EndRun):
            raise _ended(parts, name, point, outcome, item.call.id)
        if isinstance(outcome, Deny):
            raise _refuse(parts, name, point, outcome, "a result is replaced or the run ended")
        if outcome is None:
            continue
        value = outcome.value
        text = value.content if isinstance(value, ToolResult) else value
        if not isinstance(text, str):
            wanted = "Replace takes the result's text or a ToolResult"
            raise _refuse(parts, name, point, value, wanted)
        old = item.result
        cap = parts.executor.max_result_chars
        shown = text if len(text) <= cap else text[:cap] + f"\n[cut by Keel at {cap} characters]"
        result = replace(
            old, content=shown, size=len(text), digest=digest_text(text), truncated=False
        )
        _emit(parts, name, point, "replace", {"size_before": old.size, "size": len(text)},
              item.call.id)  # fmt: skip
        item = replace(item, result=result, full_content=None)
    return item
