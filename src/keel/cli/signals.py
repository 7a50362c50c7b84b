"""SIGINT, SIGTERM and SIGHUP to `keel run`/`keel resume`: exit code 1, whenever they come,
and never a traceback or a run left `running` that no process advances.

- Before the run exists (MCP servers starting, the store opening), nothing is recorded yet:
  the command stops at once and says so in one line.
- While it runs, the run is cancelled cooperatively and recorded `cancelled` (also on SIGHUP:
  a closed terminal is a person gone, and nobody would resume a run left `running`). A signal
  while the run is being set up (a model loading) cancels it as soon as it is open.
- Once it has ended, its outcome stands: the command stops where it is (printing, perhaps to
  a reader that stopped reading) and exits with the run's own code.

Outside the event loop a Python handler raises `Stopped`, a BaseException, so no `except
Exception` on the way can swallow it; inside, the loop's own signal handling cancels the run
from a callback, never from the middle of whatever the loop was doing. Signals are blocked
while one handler replaces the other, so none falls between them to the default action.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import signal
import threading
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from types import FrameType, TracebackType
from typing import ParamSpec, TypeVar

import typer
from rich.console import Console

from keel.agent import RunHandle
from keel.result import RunResult

__all__ = ["STOPPING", "Signals", "Stopped", "stoppable"]

STOPPING = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))

P = ParamSpec("P")
R = TypeVar("R")

_active: ContextVar[Signals | None] = ContextVar("keel_signals", default=None)


class Stopped(BaseException):
    """A stopping signal arrived outside the event loop."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class Signals:
    """The stopping signals for one command; leaving it restores the handlers it replaced."""

    def __init__(self, exit_codes: dict[str, int], err: Console) -> None:
        self.exit_codes = exit_codes
        self.err = err
        self.result: RunResult | None = None
        """The run's outcome, once it has one: then a signal only ends the command."""
        self._saved: dict[int, Callable[[int, FrameType | None], object] | int | None] = {}
        self._deferred = False
        self._pending: int | None = None

    @classmethod
    def active(cls) -> Signals:
        """The command's, set by `stoppable`."""
        signals = _active.get()
        if signals is None:
            raise RuntimeError("a run is started only by a command under `stoppable`")
        return signals

    def __enter__(self) -> Signals:
        if threading.current_thread() is threading.main_thread():
            with _blocked():
                for sig in STOPPING:
                    self._saved[sig] = signal.getsignal(sig)
                    signal.signal(sig, self._on_signal)
        self._token = _active.set(self)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        _active.reset(self._token)
        with _blocked():
            for sig, handler in self._saved.items():
                signal.signal(sig, handler)
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
            raise typer.Exit(1)
        raise typer.Exit(self.exit_codes[self.result.status])

    def run(self, start: Callable[[], RunHandle]) -> RunResult:
        """Start the run and wait for its outcome, a stopping signal cancelling it."""
        try:
            result = asyncio.run(self._follow(start))
        finally:
            self._deferred = False
        self.result = result
        if self._pending is not None:  # came while the loop was closing: the outcome stands
            raise Stopped(self._pending)
        return result

    async def _follow(self, start: Callable[[], RunHandle]) -> RunResult:
        loop = asyncio.get_running_loop()
        handle: RunHandle | None = None
        early: list[int] = []

        def cancel(signum: int) -> None:
            if handle is None:
                early.append(signum)
            else:
                handle.cancel()

        with _blocked():
            for sig in STOPPING:
                loop.add_signal_handler(sig, cancel, sig)
        try:
            handle = start()
            if early:
                handle.cancel()
            return await handle
        finally:
            with _blocked():
                self._deferred = True  # until `run` has the outcome in hand
                for sig in STOPPING:
                    loop.remove_signal_handler(sig)
                    signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._deferred:
            self._pending = self._pending or signum
            return
        raise Stopped(signum)


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


@contextlib.contextmanager
def _blocked() -> Iterator[None]:
    """The stopping signals held back (delivered on leaving) while handlers change."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(
        signal, "pthread_sigmask"
    ):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOPPING)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
