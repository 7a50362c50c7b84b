"""Running a batch of tool calls: errors become results, effects decide the concurrency.

Every call in a batch gets exactly one `ExecutedCall`, returned in request order. Nothing a
model or a tool does raises out of `ToolExecutor.run_batch`: arguments that are not JSON, a
tool that does not exist, arguments that break the schema, a tool that raises and a tool that
runs out of time are all answered with an error result the model can read and act on. A tool
that raises `keel.errors.ToolError` is answered with its message as it stands; one that raises
`KeyboardInterrupt`, `SystemExit` or any other `BaseException` is a failed call like any other
(a tool is not the process: it must not end the run). Only the run's own cancellation
propagates, because cancelling the run must stop the run, whatever the tool answers it with.

Concurrency follows the effects. The batch is cut, in request order, into segments:

    read, read, observe | write | read, read | write | write

Consecutive read_only and observation calls form one segment and run together
(`asyncio.gather`); each side_effecting call is a segment of its own and runs alone, after
everything before it has finished and before anything after it starts. So writes happen one at
a time in the order the model asked for them, and a read placed after a write sees the write.
Calls answered without running (bad JSON, unknown tool, invalid arguments) take no part.

Each dispatched call gets ``min(tool.timeout, deadline - now)`` seconds; a call with no time
left at all is not dispatched. The tool runs as a task of its own, so its time is kept however
it behaves: at the limit it is cancelled, and one that has not stopped `STOP_GRACE` seconds
later (it swallowed the cancellation) is abandoned, its coroutine closed where it waits, like
a stuck thread. A timeout is reported as what is known, nothing more: an async tool that ended
on its cancellation was stopped; a plain function runs in a thread that cannot be stopped, so
it is abandoned and its result discarded. A side_effecting call that timed out may have taken
effect either way, so it is answered "effect unknown" (`uncertain`), never "try again".

Results longer than the size cap are shown truncated with a marker that names the full result's
digest; the whole text travels in `ExecutedCall.full_content` so the run's store can keep it.
"""

from __future__ import annotations

import asyncio
import difflib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pydantic

from keel.errors import ConfigError, EffectUnknown, ToolError
from keel.inbound import clean_text
from keel.messages import ToolCall, ToolDefinition, ToolResult, digest_text
from keel.tools.base import (
    BUILTIN_SOURCE,
    CURRENT_CALL,
    MCP_SOURCE,
    Effect,
    Tool,
    ToolArgumentError,
)
from keel.trace_hooks import traced_tool

__all__ = [
    "STOP_GRACE",
    "Closing",
    "ExecutedCall",
    "OnDispatch",
    "ToolExecutor",
    "name_clash",
    "stop_abandoning",
]

OnDispatch = Callable[[ToolCall, Tool], Awaitable[None]]

STOP_GRACE = 0.5
"""Seconds a cancelled tool has to stop before it is abandoned."""


@dataclass(frozen=True, slots=True)
class ExecutedCall:
    """One call of a batch and what became of it."""

    call: ToolCall
    result: ToolResult
    """What the model will be shown (possibly truncated, possibly an error)."""
    full_content: str | None
    """The whole text when `result.content` was truncated, else None."""
    duration_ms: float
    """Wall time of the tool itself; 0 for calls answered without running."""
    dispatched: bool
    """False for calls answered without running: bad JSON, unknown tool, invalid args, no time."""
    timed_out: bool


@dataclass(frozen=True, slots=True)
class _Ready:
    """A call that passed every check and may run."""

    index: int
    call: ToolCall
    tool: Tool
    validated: pydantic.BaseModel


@dataclass(frozen=True, slots=True)
class _Outcome:
    content: str
    is_error: bool
    duration_ms: float = 0.0
    dispatched: bool = False
    timed_out: bool = False
    uncertain: bool = False


def name_clash(first: Tool, second: Tool) -> str:
    """Why two tools cannot share a name, naming where each comes from and the ways out that
    apply: an MCP server's prefix only when a server offers one of them, `--without-tool` only
    for a built-in tool the command line offers, else another name in code."""
    pair = (first, second)
    where = [tool.source or "a tool given in code" for tool in pair]
    ways = []
    if any(tool.source.startswith(MCP_SOURCE) for tool in pair):
        ways.append(
            'give the MCP server a prefix (keel run --mcp "prefix=web_:CMD", prefix = "web_" '
            "in its [[mcp]] table, or McpServer(prefix=...))"
        )
    builtin = next((tool for tool in pair if tool.source == BUILTIN_SOURCE), None)
    if builtin is not None:
        ways.append(f"leave the built-in one out (keel run --without-tool {builtin.name})")
    if not ways:
        ways.append(
            'give one of them another name (@keel.tool(name="...") or '
            'dataclasses.replace(tool, name="...")), or pass only one of them in tools=[...]'
        )
    return (
        f"two tools are named {first.name!r}: one from {where[0]}, one from {where[1]}; tool "
        f"names must be unique: {', or '.join(ways)}"
    )


class ToolExecutor:
    """Validates and runs the model's tool calls against a fixed set of tools."""

    def __init__(self, tools: Sequence[Tool], *, max_result_chars: int = 50_000) -> None:
        if max_result_chars <= 0:
            raise ConfigError("max_result_chars must be positive")
        by_name: dict[str, Tool] = {}
        for tool in tools:
            if tool.name in by_name:
                raise ConfigError(name_clash(by_name[tool.name], tool))
            by_name[tool.name] = tool
        self._tools = by_name
        self.delegates = any(t.delegates for t in tools)
        """Some tool starts child runs (keel/subagents.py): batches set up their children."""
        self.max_result_chars = max_result_chars
        self.definitions: tuple[ToolDefinition, ...] = tuple(t.definition() for t in tools)
        """Computed once: part of the frozen prompt prefix, byte-identical on every turn."""

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    async def run_batch(
        self,
        calls: Sequence[ToolCall],
        *,
        deadline: float | None = None,
        on_dispatch: OnDispatch | None = None,
        on_effect: Callable[[ExecutedCall], Awaitable[None]] | None = None,
    ) -> list[ExecutedCall]:
        """Run one model turn's calls; `deadline` is an absolute event-loop time.

        `on_dispatch` is awaited just before a call runs (the run journals side effects there);
        `on_effect` hears each side-effecting call's result as soon as it has one, so it can be
        recorded before the next side effect starts.
        """
        executed: list[ExecutedCall | None] = [None] * len(calls)
        segment: list[_Ready] = []

        async def flush() -> None:
            if not segment:
                return
            ready = list(segment)
            segment.clear()
            if len(ready) == 1:  # the usual batch: no task and no gather for one call
                done = [await self._run(ready[0], deadline, on_dispatch)]
            else:
                done = await asyncio.gather(*(self._run(r, deadline, on_dispatch) for r in ready))
            for r, outcome in zip(ready, done, strict=True):
                executed[r.index] = self._finish(r.call, outcome)

        for index, call in enumerate(calls):
            checked = await self._check(index, call)
            if isinstance(checked, _Outcome):
                executed[index] = self._finish(call, checked)
            elif checked.tool.effect is Effect.SIDE_EFFECTING:
                await flush()
                outcome = await self._run(checked, deadline, on_dispatch)
                executed[index] = done = self._finish(call, outcome)
                if on_effect is not None:
                    await on_effect(done)
            else:
                segment.append(checked)
        await flush()
        return [item for item in executed if item is not None]

    async def _check(self, index: int, call: ToolCall) -> _Ready | _Outcome:
        """Answer what can be answered without running the tool; arguments checked against a
        schema from outside are checked off the event loop (`Tool.checked`)."""
        if call.parse_error is not None:
            return _Outcome(
                f"Error: the arguments for {call.name} could not be read: {call.parse_error}. "
                "Send the arguments again as one valid JSON object.",
                is_error=True,
            )
        tool = self._tools.get(call.name)
        if tool is None:
            return _Outcome(self._unknown_tool_message(call.name), is_error=True)
        try:
            validated = await tool.checked(call.arguments)
        except ToolArgumentError as exc:
            return _Outcome(
                f"Error: {exc}. Fix the arguments to match the tool's schema and call again.",
                is_error=True,
            )
        return _Ready(index, call, tool, validated)

    def _unknown_tool_message(self, name: str) -> str:
        if not self._tools:
            return f"Error: there is no tool named {name!r}; no tools are available."
        names = sorted(self._tools)
        message = f"Error: there is no tool named {name!r}. Available tools: {', '.join(names)}."
        close = difflib.get_close_matches(name, names, n=1)
        if close:
            message += f" Did you mean {close[0]!r}?"
        return message

    async def _run(
        self, ready: _Ready, deadline: float | None, on_dispatch: OnDispatch | None
    ) -> _Outcome:
        tool, name = ready.tool, ready.call.name
        loop = asyncio.get_running_loop()
        if deadline is not None and deadline - loop.time() <= 0:
            return _Outcome(
                f"Error: {name} was not run: the run's deadline has passed.",
                is_error=True,
                timed_out=True,
            )
        if on_dispatch is not None:
            await on_dispatch(ready.call, tool)
        started = loop.time()
        limit_at = started + tool.timeout
        by_deadline = deadline is not None and deadline < limit_at
        if deadline is not None:
            limit_at = min(limit_at, deadline)
        with traced_tool(ready.call):
            closing = Closing()
            work = asyncio.ensure_future(_contained(tool, ready.validated, ready.call, closing))
            try:
                await asyncio.wait((work,), timeout=max(0.0, limit_at - loop.time()))
            except asyncio.CancelledError:  # the run is cancelled: so is the call
                await stop_abandoning(work, closing)
                raise
            elapsed = loop.time() - started
            if not work.done():
                stopped = await stop_abandoning(work, closing)
                why = "the run's deadline" if by_deadline else f"its {tool.timeout:g}s limit"
                return _timed_out(tool, elapsed, why, stopped)
        raised = work.result()  # `_contained` returns what the tool raised, never raises it
        if not isinstance(raised, BaseException):
            return _Outcome(raised, False, _ms(elapsed), dispatched=True)
        if isinstance(raised, ToolError):
            text = str(raised).strip() or f"Error: {name} failed (no message)"
            uncertain = isinstance(raised, EffectUnknown) and tool.effect is Effect.SIDE_EFFECTING
            return _Outcome(text, True, _ms(elapsed), dispatched=True, uncertain=uncertain)
        return _Outcome(_raised(name, raised), True, _ms(elapsed), dispatched=True)

    def _shortened(self, call: ToolCall, outcome: _Outcome, full: str) -> str | None:
        """The tool's own cut of a long result (one that says how to read on), if it has one."""
        tool = self._tools.get(call.name)
        if tool is None or tool.shorten is None or outcome.is_error:
            return None
        if not isinstance(call.arguments, dict):
            return None
        cut = tool.shorten(call.arguments, full, self.max_result_chars)
        return cut if cut and len(cut) <= self.max_result_chars + 400 else None

    def _finish(self, call: ToolCall, outcome: _Outcome) -> ExecutedCall:
        """Apply the size cap and build the result the model will see: text the store, a
        terminal and JSON can all hold (keel.inbound)."""
        full = clean_text(outcome.content)
        digest = digest_text(full)
        truncated = len(full) > self.max_result_chars
        shown = full
        if truncated:
            head = self._shortened(call, outcome, full) or full[: self.max_result_chars]
            shown = (
                f"{head}\n[truncated: showing {len(head)} of {len(full)} characters; full "
                f"result sha256:{digest[:16]} kept in the run's store]"
            )
        result = ToolResult(
            call_id=call.id,
            name=call.name,
            call_key=call.key,
            content=shown,
            is_error=outcome.is_error,
            size=len(full),
            digest=digest,
            truncated=truncated,
            uncertain=outcome.uncertain,
        )
        return ExecutedCall(
            call=call,
            result=result,
            full_content=full if truncated else None,
            duration_ms=outcome.duration_ms,
            dispatched=outcome.dispatched,
            timed_out=outcome.timed_out,
        )


async def _contained(
    tool: Tool, validated: pydantic.BaseModel, call: ToolCall, closing: Closing
) -> str | BaseException:
    """The tool's text, or what it raised: nothing it raises may leave its task, where
    KeyboardInterrupt and SystemExit would stop the event loop itself. Only a cancellation of
    this task goes on as one (a CancelledError the tool raised on its own is a failure), and
    a GeneratorExit only when `stop_abandoning` closed the coroutine (one the tool raised is
    a failure).
    The call is in `CURRENT_CALL` while the tool runs (in this task's own context)."""
    CURRENT_CALL.set(call)
    try:
        return await tool.invoke(validated)
    except asyncio.CancelledError as exc:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise
        return exc
    except GeneratorExit as exc:
        if closing.closed:  # closed by `stop_abandoning`: the frame must end
            raise
        return exc
    except BaseException as exc:
        return exc


class Closing:
    """Set by `stop_abandoning` before it closes a call's coroutine, so the GeneratorExit
    that closing throws in is told from one the tool (or hook) raised itself."""

    closed = False


async def stop_abandoning(work: asyncio.Task[Any], closing: Closing) -> bool:
    """Cancel the call; True if it stopped within STOP_GRACE. One that did not (it swallowed
    the cancellation) is abandoned: its coroutine is closed where it waits, so it never runs
    again and no event loop waits for it at exit."""
    work.cancel()
    await asyncio.wait((work,), timeout=STOP_GRACE)
    if work.done():
        if not work.cancelled():
            work.exception()  # retrieved: whatever it was, its call is answered already
        return True
    work.add_done_callback(lambda t: t.cancelled() or t.exception())
    closing.closed = True
    try:
        work.get_coro().close()
    except RuntimeError:  # it swallowed GeneratorExit too: left to itself, like a stuck thread
        return False
    work.cancel()  # wakes the task, which ends at once on its closed coroutine
    return False


def _timed_out(tool: Tool, elapsed: float, why: str, stopped: bool) -> _Outcome:
    """What a timeout means depends on whether the tool could be stopped and on its effect."""
    head = f"{tool.name} timed out after {elapsed:.1f}s ({why})"
    if tool.runs_in_thread:
        fate = "it could not be stopped, so it was abandoned and its result will be discarded"
    elif stopped:
        fate = "it was stopped"
    else:
        fate = "it did not stop when cancelled, so it was abandoned and its result discarded"
    if tool.effect is Effect.SIDE_EFFECTING:
        text = (
            f"Effect unknown: {head}; {fate}. It may or may not have taken effect. Check its "
            "effect before relying on it, and do not repeat it blindly."
        )
    else:
        text = f"Error: {head}; {fate}. Try a smaller request, or go on without this result."
    return _Outcome(
        text,
        is_error=True,
        duration_ms=_ms(elapsed),
        dispatched=True,
        timed_out=True,
        uncertain=tool.effect is Effect.SIDE_EFFECTING,
    )


def _raised(name: str, exc: BaseException) -> str:
    detail = str(exc).strip() or "(no message)"
    return f"Error: {name} failed: {type(exc).__name__}: {detail}"


def _ms(seconds: float) -> float:
    return seconds * 1000.0
