"""An event loop on a daemon thread, for sessions that must outlive their callers' loops.

A Playwright browser belongs to the loop that started it, an MCP client to the task that opened
it; Keel's callers come and go with their loops (`Agent.run` is one `asyncio.run` per run). So
each such session runs its work on a loop of its own, started on first use: a call from any loop
or thread is handed over with the caller's context variables (a trace continues there),
cancelling the caller cancels the work on the loop too, and `stop` works from anywhere.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["LoopThread"]

T = TypeVar("T")


class LoopThread:
    """An event loop on a daemon thread named `name`, started on first use, stopped by `stop`,
    which waits `stop_timeout` seconds at most for the thread to end."""

    def __init__(self, name: str, stop_timeout: float) -> None:
        self.name = name
        self.stop_timeout = stop_timeout
        self._guard = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._loop is not None

    def submit(self, coro: Coroutine[Any, Any, T]) -> Any:
        """Schedule `coro` on the loop; returns a concurrent.futures.Future."""
        with self._guard:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name=self.name, daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
            return asyncio.run_coroutine_threadsafe(coro, self._loop)

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await `coro` on the loop; cancelling the caller cancels it there too."""
        result: T = await asyncio.wrap_future(self.submit(coro))
        return result

    def run_blocking(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        """`run` for code without an event loop; raises TimeoutError after `timeout` seconds."""
        result: T = self.submit(coro).result(timeout)
        return result

    def stop(self) -> None:
        """Stop the loop and wait for its thread; a loop whose thread does not end in time is
        left open rather than closed under it. Safe to call twice."""
        with self._guard:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(self.stop_timeout)
        if not thread.is_alive():
            loop.close()
