"""SIGINT, SIGTERM and SIGHUP to `keel run`/`keel resume`: the documented exit code whenever
they come, and never a traceback or a run left `running` that no process advances.

- Before the run exists (MCP servers starting, the store opening), nothing is recorded yet:
  the command stops at once, in one line, with exit code 1.
- While it runs, the run is cancelled cooperatively and recorded `cancelled` (also on SIGHUP:
  a closed terminal is a person gone, and nobody would resume a run left `running`); exit 1.
  A cancelled run was interrupted, not ended: stderr says so at once, and `keel resume`
  continues it (ADR 0036).
  A signal while the run is being set up (a model loading) cancels it as soon as it is open.
  A second signal changes nothing: the cancellation is under way.
- Once the run has ended, its outcome stands: the command gets `AFTER_SECONDS` to finish
  printing (to a reader that stopped reading, it would wait forever), then ends with the run's
  own code; a signal as it exits ends it there, with the code it has decided.

One Python handler serves the whole command, so no signal ever meets a default handler in
between. Before the run it raises `Stopped`, a BaseException, so no `except Exception` on
the way swallows it; during the run it only schedules the cancel on the event loop
(`call_soon_threadsafe`), never cancelling from the middle of whatever the loop was doing.
Ending with `os._exit` is for the command line's own process (`own_process`, set by `main`),
once nothing is left to clean up; a program that calls the command gets `Stopped` instead.
"""

from __future__ import annotations

import atexit
import functools
import os
import signal
import threading
from collections.abc import Callable
from contextvars import ContextVar
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Literal, ParamSpec, TypeVar

import typer

if TYPE_CHECKING:  # the command line starts without them (ADR 0042)
    import asyncio

    from rich.console import Console

    from keel.agent import RunHandle
    from keel.result import RunResult

__all__ = ["AFTER_SECONDS", "STOPPING", "Signals", "Stopped", "own_process", "stoppable"]

STOPPING = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))

P = ParamSpec("P")
R = TypeVar("R")

_active: ContextVar[Signals | None] = ContextVar("keel_signals", default=None)
_own_process = False

Phase = Literal["before", "running", "settling", "after"]

AFTER_SECONDS = 1.0
"""After the run has ended, how long a signalled command may go on printing."""


def own_process() -> None:
    """This process is the `keel` command itself (`main`), not a program that calls it: a
    signal after the run may end it at once, and its handlers need not be given back.

    The last exit hook (registered first, run last) ignores the stopping signals: by then
    threads are joined and the other hooks have run, and what is left of the interpreter's
    exit puts the default handlers back, which would end the process with the signal's own
    status instead of the code the command decided."""
    global _own_process
    _own_process = True
    atexit.register(_ignore_stopping)


def _ignore_stopping() -> None:
    for sig in STOPPING:
        signal.signal(sig, signal.SIG_IGN)


class Stopped(BaseException):
    """A stopping signal arrived outside the event loop."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class Signals:
    """The stopping signals for one command; leaving it gives back the handlers it replaced
    (or, in the command line's own process, keeps the exit code it decided)."""

    def __init__(self, exit_codes: dict[str, int], err: Console) -> None:
        self.exit_codes = exit_codes
        self.err = err
        self.result: RunResult | None = None
        """The run's outcome, once it has one."""
        self._phase: Phase = "before"
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: RunHandle | None = None
        self._early = False
        self._told = False
        """A signal came while the run was being started: cancel it once it is."""
        self._saved: dict[int, Callable[[int, FrameType | None], object] | int | None] = {}

    @classmethod
    def active(cls) -> Signals:
        """The command's, set by `stoppable`."""
        signals = _active.get()
        if signals is None:
            raise RuntimeError("a run is started only by a command under `stoppable`")
        return signals

    def __enter__(self) -> Signals:
        if threading.current_thread() is threading.main_thread():
            for sig in STOPPING:
                self._saved[sig] = signal.signal(sig, self._on_signal)
        self._token = _active.set(self)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        _active.reset(self._token)
        code = self._code(exc)
        for sig, handler in self._saved.items():
            signal.signal(sig, _ending(code) if _own_process else handler)
        if not isinstance(exc, Stopped):
            return
        if self.result is None:
            self.err.print(
                f"keel: stopped by {signal.Signals(exc.signum).name} before the run started; "
                "nothing was recorded",
                highlight=False,
                markup=False,
                soft_wrap=True,
            )
        raise typer.Exit(code)

    def run(self, start: Callable[[], RunHandle]) -> RunResult:
        """Start the run and wait for its outcome, a stopping signal cancelling it."""
        import asyncio

        try:
            result = asyncio.run(self._follow(start))
        except BaseException:
            self._phase = "before"  # no outcome came of it
            raise
        self.result, self._phase = result, "after"
        return result

    async def _follow(self, start: Callable[[], RunHandle]) -> RunResult:
        import asyncio

        self._loop, self._phase = asyncio.get_running_loop(), "running"
        try:
            self._handle = start()
            if self._early:
                self._handle.cancel()
            return await self._handle
        finally:
            self._phase = "settling"

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        handle, loop = self._handle, self._loop
        match self._phase:
            case "running" if handle is None or loop is None:
                self._early = True
            case "running" if handle is not None and loop is not None:
                loop.call_soon_threadsafe(self._interrupt, signum, handle)
            case "settling":  # the run has ended: its outcome stands
                pass
            case "after" if _own_process and self.result is not None:
                code = self.exit_codes[self.result.status]
                timer = threading.Timer(AFTER_SECONDS, os._exit, (code,))
                timer.daemon = True
                timer.start()
                self._phase = "settling"  # one timer is enough
            case _:
                raise Stopped(signum)

    def _interrupt(self, signum: int, handle: RunHandle) -> None:
        """On the loop: say what happens (once), then cancel the run."""
        if not self._told:
            self._told = True
            self.err.print(
                f"keel: {signal.Signals(signum).name}: interrupting run {handle.run_id}; "
                "`keel resume` continues it",
                highlight=False,
                markup=False,
                soft_wrap=True,
            )
        handle.cancel()

    def _code(self, exc: BaseException | None) -> int:
        """The exit code the command ends with, leaving with `exc`."""
        if isinstance(exc, Stopped):
            return 1 if self.result is None else self.exit_codes[self.result.status]
        if isinstance(exc, typer.Exit):
            return int(exc.exit_code)
        if exc is None:
            return 0
        if isinstance(exc, SystemExit):
            return exc.code if isinstance(exc.code, int) else 1
        return 1


def stoppable(
    exit_codes: dict[str, int], err: Console
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Put a command under `Signals` from its first line (the run finds them with `active`);
    `exit_codes` maps a run's status to the command's exit code."""

    def decorate(command: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(command)
        def guarded(*args: P.args, **kwargs: P.kwargs) -> R:
            with Signals(exit_codes, err):
                return command(*args, **kwargs)

        return guarded

    return decorate


def _ending(code: int) -> Callable[[int, FrameType | None], None]:
    """The handler once the command has decided its exit code: end with it, now."""

    def end(signum: int, frame: FrameType | None) -> None:
        os._exit(code)  # stderr's lines are out already: it is line-buffered

    return end
