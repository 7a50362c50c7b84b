"""The library's front door: `Agent(model=..., tools=[...], limits=Limits(...)).run(question)`.

The command line is a thin layer over this class; both produce the same RunResult.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Collection, Generator, Sequence
from pathlib import Path
from typing import Any, cast

import platformdirs

from keel import approvals, resume
from keel.context import ContextBuilder
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
from keel.transports.base import LocalModel, PinnedSampling, Resumable, Transport

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
    ) -> None:
        self.model_spec = model if isinstance(model, str) else None
        self.base_url = base_url
        self.transport = (
            resolve_model(model, base_url=base_url) if isinstance(model, str) else model
        )
        """The transport runs use. Built from a spec with a per-run position (a script), it
        serves the first run only: each later run gets its own (see `_run_transport`)."""
        self._transport_taken = False
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

    @property
    def store(self) -> Store:
        """Opened on first use, so constructing an Agent touches no disk."""
        if self._store is None:
            arg = self._store_arg
            self._store = Store(default_store_path() if arg is None else arg)  # type: ignore[arg-type]
        return self._store

    def _setup(self, limits: Limits | None = None) -> RunSetup:
        """`limits`: a resumed run's own, saved with it; else this agent's."""
        limits = limits or self.limits
        transport = self._run_transport()
        settings = dict(self.run_config)
        if isinstance(transport, PinnedSampling):  # recorded, so `keel show` can say it
            settings["sampling"] = cast(JsonObject, dict(transport.sampling))
        config = RunConfig(
            model=self.model_spec or self.transport.name,
            system_prompt=self.system_prompt,
            tools=tuple(t.name for t in self.tools),
            approve_tools=tuple(sorted(self.approve_tools)),
            limits=limits,
            settings=settings,
        )
        counter, window = _model_window(transport)
        budget = limits.context_tokens
        result_cap = limits.max_result_chars
        if window is not None:  # a local model's window is small and hard: stay inside it
            budget = max(256, min(budget, window - WINDOW_MARGIN))
            result_cap = min(result_cap, max(100, budget * CHARS_PER_TOKEN // RESULTS_PER_WINDOW))
        context = ContextBuilder(
            self.system_prompt,
            self.executor.definitions,
            self.token_counter or counter or EstimatingCounter(),
            budget=budget,
        )
        return RunSetup(
            transport=transport,
            executor=self.executor
            if result_cap == self.executor.max_result_chars
            else ToolExecutor(self.tools, max_result_chars=result_cap),
            limits=limits,
            context=context,
            store=self.store,
            listeners=self.listeners,
            approve_tools=self.approve_tools,
            config=config,
            lease_ttl=self.lease_ttl,
        )

    def _run_transport(self) -> Transport:
        """The transport for the next run. One built from a spec that keeps a per-run position
        (a `Resumable`: a script) is built anew for every run after the first, so an Agent can
        run twice, or two questions at once, each from the script's start (a resumed run then
        restores its own position into it). Stateless transports (the providers, the local
        model, which keeps its loaded weights and prompt cache) are shared by every run."""
        if self.model_spec is None or not isinstance(self.transport, Resumable):
            return self.transport
        if not self._transport_taken:
            self._transport_taken = True
            return self.transport
        return resolve_model(self.model_spec, base_url=self.base_url)

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
"""Tokens the context builder does not see: chat markers and the tool format's own text."""
CHARS_PER_TOKEN = 3
"""A low estimate of characters per token in code and prose, for sizing results to a window."""
RESULTS_PER_WINDOW = 4
"""In a local model's small window, one tool result is cut to a quarter of the context budget:
the newest result is never elided, so a result larger than the window would end the run with a
context overflow instead of leaving room for the next turn."""


def _model_window(transport: Transport) -> tuple[TokenCounter | None, int | None]:
    """A `LocalModel` transport (directly, or under the XML fallback, which forwards it) offers
    its tokenizer and its input window. Loads the model: it is needed for the run anyway."""
    if isinstance(transport, LocalModel):
        return transport.token_counter(), transport.input_token_limit
    return None, None


def new_run_id() -> str:
    return "run_" + uuid.uuid4().hex[:16]
