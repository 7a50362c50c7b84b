"""Running a plain-function tool in a daemon thread of its own.

A Python thread cannot be stopped from outside. `asyncio.to_thread` uses the loop's default
executor, whose workers are not daemons: `asyncio.run` waits for them when it closes the loop,
and the interpreter joins them at exit. A tool stuck in a blocking call (a FIFO, a hung socket)
would then keep the whole process alive after its timeout, with the run already recorded as
finished. Here each call gets a daemon thread instead: on timeout the caller stops waiting, the
thread is abandoned, its eventual result is dropped, and it never holds the process open.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import threading
from collections.abc import Callable
from typing import TypeVar

__all__ = ["run_in_daemon_thread"]

T = TypeVar("T")


async def run_in_daemon_thread(fn: Callable[[], T], name: str = "keel-tool") -> T:
    """`fn()` on a new daemon thread, with the caller's context variables.

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

    threading.Thread(target=work, name=name, daemon=True).start()
    return await future
