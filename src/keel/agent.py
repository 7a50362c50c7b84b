"""The library's front door: `Agent(model=..., tools=[...], limits=Limits(...)).run(question)`.

The command line is a thin layer over this class; both produce the same RunResult.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Generator, Sequence
from pathlib import Path
from typing import Any

import platformdirs

from keel.context import ContextBuilder
from keel.limits import Limits
from keel.loop import RunLoop
from keel.models import resolve_model
from keel.recorder import Listener
from keel.result import RunResult
from keel.store import Store
from keel.tokens import EstimatingCounter, TokenCounter
from keel.tools.base import Tool, make_tool
from keel.tools.executor import ToolExecutor
from keel.transports.base import Transport

DEFAULT_SYSTEM_PROMPT = (
    "You are a careful research agent. Use the tools to gather evidence from the repository "
    "and the web before you answer. Do not request the same tool call twice: results you "
    "already received stay in this conversation. Answer as soon as the evidence supports an "
    "answer, cite the files and URLs you relied on, and say what remains unknown."
)


def default_store_path() -> Path:
    return Path(platformdirs.user_data_dir("keel")) / "keel.sqlite"


class RunHandle:
    """A run in progress: await it for the RunResult, or cancel it cooperatively."""

    def __init__(self, loop: RunLoop, task: asyncio.Task[RunResult]) -> None:
        self._loop = loop
        self._task = task
        self.run_id = loop.run_id

    def cancel(self) -> None:
        """Stop at once: in-flight calls are cancelled, the run ends `cancelled`, nothing
        recorded is lost."""
        if not self._task.done():
            self._loop.cancel_requested = True
            self._task.cancel()

    def __await__(self) -> Generator[Any, None, RunResult]:
        return self._task.__await__()


class Agent:
    def __init__(
        self,
        model: str | Transport,
        *,
        tools: Sequence[Tool | Callable[..., Any]] = (),
        limits: Limits | None = None,
        system_prompt: str = DEFAULT_SYSTEM_PROMPT,
        store: Store | str | Path | None = None,
        token_counter: TokenCounter | None = None,
        listeners: Sequence[Listener] = (),
    ) -> None:
        self.transport = resolve_model(model) if isinstance(model, str) else model
        self.tools = [t if isinstance(t, Tool) else make_tool(t) for t in tools]
        self.limits = limits or Limits()
        self.executor = ToolExecutor(self.tools, max_result_chars=self.limits.max_result_chars)
        self.system_prompt = system_prompt
        self.token_counter = token_counter or EstimatingCounter()
        self.listeners = tuple(listeners)
        self._owns_store = not isinstance(store, Store)
        self._store_arg = store
        self._store: Store | None = store if isinstance(store, Store) else None

    @property
    def store(self) -> Store:
        """Opened on first use, so constructing an Agent touches no disk."""
        if self._store is None:
            arg = self._store_arg
            self._store = Store(default_store_path() if arg is None else arg)  # type: ignore[arg-type]
        return self._store

    def start(self, question: str) -> RunHandle:
        """Begin a run in the running event loop; returns at once."""
        loop = RunLoop(
            run_id=new_run_id(),
            question=question,
            transport=self.transport,
            executor=self.executor,
            limits=self.limits,
            context=ContextBuilder(
                self.system_prompt,
                self.executor.definitions,
                self.token_counter,
                budget=self.limits.context_tokens,
            ),
            store=self.store,
            listeners=self.listeners,
        )
        return RunHandle(loop, asyncio.ensure_future(loop.run()))

    async def arun(self, question: str) -> RunResult:
        handle = self.start(question)
        try:
            return await handle
        except asyncio.CancelledError:
            handle.cancel()
            raise

    def run(self, question: str) -> RunResult:
        """The blocking facade for scripts."""
        return asyncio.run(self.arun(question))

    def close(self) -> None:
        if self._owns_store and self._store is not None:
            self._store.close()
            self._store = None

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def new_run_id() -> str:
    return "run_" + uuid.uuid4().hex[:16]
