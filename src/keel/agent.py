"""The library's front door: `Agent(model=..., tools=[...], limits=Limits(...)).run(question)`.

The command line is a thin layer over this class; both produce the same RunResult.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Collection, Generator, Sequence
from pathlib import Path
from typing import Any

import platformdirs

from keel import approvals, resume
from keel.context import ContextBuilder
from keel.durability import Durability, check_durability
from keel.errors import ConfigError
from keel.limits import Limits
from keel.loop import RunLoop, RunSetup
from keel.models import resolve_model
from keel.recorder import Listener
from keel.records import JsonObject, RunConfig
from keel.result import PendingApproval, RunResult
from keel.store import Store
from keel.tokens import EstimatingCounter, TokenCounter
from keel.tools.base import Tool, make_tool
from keel.tools.executor import ToolExecutor
from keel.transports.base import LocalModel, Transport

__all__ = ["DEFAULT_SYSTEM_PROMPT", "Agent", "RunHandle", "default_store_path", "new_run_id"]

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
        base_url: str | None = None,
        tools: Sequence[Tool | Callable[..., Any]] = (),
        limits: Limits | None = None,
        system_prompt: str = DEFAULT_SYSTEM_PROMPT,
        store: Store | str | Path | None = None,
        token_counter: TokenCounter | None = None,
        listeners: Sequence[Listener] = (),
        approve_tools: Collection[str] = (),
        run_config: JsonObject | None = None,
        lease_ttl: float = 30.0,
        durability: Durability | None = None,
    ) -> None:
        """`durability`: "process" (the default) or "power" (each step's commit fsynced, so
        a power cut loses nothing committed; see `keel/durability.py`). It applies to the
        store the agent opens; a `Store` passed in keeps its own, and naming another is an
        error."""
        self.model_spec = model if isinstance(model, str) else None
        self.transport = (
            resolve_model(model, base_url=base_url) if isinstance(model, str) else model
        )
        self.tools = [t if isinstance(t, Tool) else make_tool(t) for t in tools]
        self.limits = limits or Limits()
        self.executor = ToolExecutor(self.tools, max_result_chars=self.limits.max_result_chars)
        self.system_prompt = system_prompt
        self.token_counter: TokenCounter | None = token_counter
        """None: the model's own tokenizer when its transport offers one, else an estimate."""
        self.listeners = tuple(listeners)
        self.approve_tools = frozenset(approve_tools)
        self.run_config = dict(run_config or {})
        """Extra settings saved with each run (the command line keeps --repo and friends)."""
        self.lease_ttl = lease_ttl
        self._owns_store = not isinstance(store, Store)
        self._store_arg = store
        self._store: Store | None = store if isinstance(store, Store) else None
        if durability is not None:
            durability = check_durability(durability)
        if self._store is not None and durability not in (None, self._store.durability):
            raise ConfigError(
                f"the store passed in was opened with durability {self._store.durability!r}: "
                f"open it with Store(..., durability={durability!r}) instead"
            )
        self.durability: Durability = durability or (
            self._store.durability if self._store is not None else "process"
        )

    @property
    def store(self) -> Store:
        """Opened on first use, so constructing an Agent touches no disk."""
        if self._store is None:
            arg = self._store_arg
            path = default_store_path() if arg is None else arg
            self._store = Store(path, durability=self.durability)  # type: ignore[arg-type]
        return self._store

    def _setup(self, limits: Limits | None = None) -> RunSetup:
        """`limits`: a resumed run's own, saved with it; else this agent's."""
        limits = limits or self.limits
        config = RunConfig(
            model=self.model_spec or self.transport.name,
            system_prompt=self.system_prompt,
            tools=tuple(t.name for t in self.tools),
            approve_tools=tuple(sorted(self.approve_tools)),
            limits=limits,
            settings=self.run_config,
        )
        counter, window = _model_window(self.transport)
        budget = limits.context_tokens
        if window is not None:  # a local model's window is small and hard: stay inside it
            budget = max(256, min(budget, window - WINDOW_MARGIN))
        context = ContextBuilder(
            self.system_prompt,
            self.executor.definitions,
            self.token_counter or counter or EstimatingCounter(),
            budget=budget,
        )
        return RunSetup(
            transport=self.transport,
            executor=self.executor
            if limits == self.limits
            else ToolExecutor(self.tools, max_result_chars=limits.max_result_chars),
            limits=limits,
            context=context,
            store=self.store,
            listeners=self.listeners,
            approve_tools=self.approve_tools,
            config=config,
            lease_ttl=self.lease_ttl,
        )

    def start(self, question: str) -> RunHandle:
        """Begin a run in the running event loop; returns at once."""
        try:
            question.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ConfigError(
                f"the question is not valid text: it holds {exc.object[exc.start : exc.end]!r} "
                "(bytes that are not UTF-8?)"
            ) from None
        loop = RunLoop(new_run_id(), question, self._setup())
        return RunHandle(loop, asyncio.ensure_future(loop.run()))

    def start_resume(self, run_id: str) -> RunHandle:
        """Continue a stored run that has not ended (paused, or its process died), from its
        last step: same counters, budgets spent and elisions. Raises ConfigError if the run is
        unknown or finished, LeaseHeld if another live process is advancing it."""
        point = resume.load(self.store, run_id)
        loop = RunLoop(
            run_id, point.record.question, self._setup(point.record.config.limits), point
        )
        return RunHandle(loop, asyncio.ensure_future(loop.run()))

    async def arun(self, question: str) -> RunResult:
        return await _drive(self.start(question))

    def run(self, question: str) -> RunResult:
        """The blocking facade for scripts."""
        return asyncio.run(self.arun(question))

    async def aresume(self, run_id: str) -> RunResult:
        return await _drive(self.start_resume(run_id))

    def resume(self, run_id: str) -> RunResult:
        return asyncio.run(self.aresume(run_id))

    # -- approvals ---------------------------------------------------------------------------

    def pending_approvals(self, run_id: str) -> tuple[PendingApproval, ...]:
        return approvals.pending(self.store, run_id)

    def approve(
        self, run_id: str, call_id: str | None = None, *, by: str | None = None
    ) -> list[str]:
        """Approve one pending call, or all of them; `resume` then dispatches them."""
        return approvals.approve(self.store, run_id, call_id, by)

    def deny(self, run_id: str, call_id: str, *, reason: str, by: str | None = None) -> None:
        """Deny a pending call; the model is told who denied it and why, and not to retry."""
        approvals.deny(self.store, run_id, call_id, reason, by)

    def close(self) -> None:
        if self._owns_store and self._store is not None:
            self._store.close()
            self._store = None

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _drive(handle: RunHandle) -> RunResult:
    try:
        return await handle
    except asyncio.CancelledError:
        handle.cancel()
        raise


WINDOW_MARGIN = 700
"""Tokens the context builder does not see: chat markers and the XML fallback's instruction."""


def _model_window(transport: Transport) -> tuple[TokenCounter | None, int | None]:
    """A `LocalModel` transport (directly, or under the XML fallback, which forwards it) offers
    its tokenizer and its input window. Loads the model: it is needed for the run anyway."""
    if isinstance(transport, LocalModel):
        return transport.token_counter(), transport.input_token_limit
    return None, None


def new_run_id() -> str:
    return "run_" + uuid.uuid4().hex[:16]
