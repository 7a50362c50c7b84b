"""Running a plain-function tool on a daemon thread.

A Python thread cannot be stopped from outside. `asyncio.to_thread` uses the loop's default
executor, whose workers are not daemons: `asyncio.run` waits for them when it closes the loop,
and the interpreter joins them at exit. A tool stuck in a blocking call (a FIFO, a hung socket)
would then keep the whole process alive after its timeout, with the run already recorded as
finished. Here calls run on daemon threads instead: on timeout the caller stops waiting, the
thread is abandoned, its eventual result is dropped, and it never holds the process open.

Starting a thread costs more than a cheap tool call itself, so finished threads wait for the
next call (up to `MAX_IDLE` of them); a call that finds none idle starts a new one, so a stuck
tool never delays another.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import os
import threading
from collections.abc import Callable
from queue import SimpleQueue
from typing import TypeVar

__all__ = ["MAX_IDLE", "run_in_daemon_thread"]

T = TypeVar("T")

MAX_IDLE = 8
"""Finished daemon threads kept waiting for the next call."""

_lock = threading.Lock()
_idle = 0
_jobs: SimpleQueue[Callable[[], None]] = SimpleQueue()


def _submit(job: Callable[[], None]) -> None:
    global _idle
    with _lock:
        if _idle:
            _idle -= 1
            _jobs.put(job)
            return
    threading.Thread(target=_serve, args=(job,), name="keel-tool", daemon=True).start()


def _serve(job: Callable[[], None]) -> None:
    global _idle
    while True:
        job()
        with _lock:
            if _idle >= MAX_IDLE:
                return
            _idle += 1
        job = _jobs.get()


def _forget_threads() -> None:
    """A forked child has none of its parent's threads."""
    global _idle, _jobs, _lock
    _idle, _jobs, _lock = 0, SimpleQueue(), threading.Lock()


os.register_at_fork(after_in_child=_forget_threads)


async def run_in_daemon_thread(fn: Callable[[], T]) -> T:
    """`fn()` on a daemon thread, with the caller's context variables.

    Cancelling the await abandons the thread (it cannot be stopped); what it later returns or
    raises is discarded, even if the event loop has closed by then.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()
    context = contextvars.copy_context()

    def deliver(settle: Callable[[], None]) -> None:
        def apply() -> None:
            if not future.done():
                settle()

        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting
            loop.call_soon_threadsafe(apply)

    def work() -> None:
        try:
            value = context.run(fn)
        except Exception as exc:
            deliver(functools.partial(future.set_exception, exc))
        except BaseException as exc:  # SystemExit and the like must not end the run from here
            wrapped = RuntimeError(f"the tool raised {type(exc).__name__}: {exc}")
            deliver(functools.partial(future.set_exception, wrapped))
        else:
            deliver(functools.partial(future.set_result, value))

    _submit(work)
    return await future
