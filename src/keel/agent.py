"""The library's front door: `Agent(model=..., tools=[...], limits=Limits(...)).run(question)`.

The command line is a thin layer over this class; both produce the same RunResult.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Awaitable, Callable, Collection, Generator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pydantic

from keel import approvals
from keel._run import history, resume
from keel._run.context import ContextBuilder
from keel._run.loop import RunLoop, RunSetup
from keel._run.recorder import Listener
from keel.durability import Durability, check_durability
from keel.errors import ConfigError, ToolError
from keel.events import RunStream, TreeListener
from keel.hooks import Hooks
from keel.limits import Limits
from keel.models import first_turn_tool_default, resolve_model
from keel.options import check_tool_names
from keel.pricing import Price, PriceTable, price_name
from keel.records import JsonObject, RunConfig
from keel.result import PendingApproval, RunResult
from keel.store import RunStore, Store, open_store
from keel.store.locate import default_store_path, is_url
from keel.structured import OutputSpec
from keel.tokens import EstimatingCounter, TokenCounter
from keel.tools.base import Tool, make_tool
from keel.tools.executor import ToolExecutor
from keel.trace_hooks import capture_content, tracing_possible
from keel.transports.base import (
    CountsTokens,
    LocalModel,
    PinnedSampling,
    Resumable,
    Transport,
    server_of,
)
from keel.transports.streaming import TextListener

if TYPE_CHECKING:  # imported for a run that may be traced (`_begin_trace`)
    from keel._run.fork import ForkPrefix
    from keel.telemetry import RunTrace

__all__ = ["DEFAULT_SYSTEM_PROMPT", "Agent", "RunHandle", "default_store_path", "new_run_id"]

DEFAULT_SYSTEM_PROMPT = (
    "You are a careful research agent. Use the tools to gather evidence from the repository "
    "and the web before you answer. Do not request the same tool call twice: results you "
    "already received stay in this conversation. Answer as soon as the evidence supports an "
    "answer, cite the files and URLs you relied on, and say what remains unknown. Each tool "
    "result begins with its id in brackets, like [r1]: cite the results a statement rests on "
    "by their ids ([r1], [r2]), and put a direct quote in double quotation marks followed by "
    'the id of the result it comes from ("the exact words" [r1]).'
)


class RunHandle:
    """A run in progress: await it for the RunResult, or cancel it cooperatively."""

    def __init__(self, loop: RunLoop, task: asyncio.Task[RunResult]) -> None:
        self._loop = loop
        self._task = task
        self.run_id = loop.run_id

    def stop(self) -> None:
        """Stop after the current step: saved, the lease released, the run left `running` for
        another process to continue (its result says `running`)."""
        self._loop.stop_requested = True

    def cancel(self) -> None:
        """Stop at once: in-flight calls are cancelled, the run is recorded `cancelled` (an
        interruption: `resume` continues it, ADR 0036), nothing recorded is lost. Before the
        run is open (created or taken over in the store), it is
        only asked to stop: it opens, then ends `cancelled` at once, so a cancel that comes
        early (a signal while the model loads) still leaves a record of the run. Once is
        enough: a second cancel (Ctrl-C pressed again) does not interrupt the run's last save."""
        if not self._task.done() and not self._loop.cancel_requested:
            self._loop.cancel_requested = True
            if self._loop.opened:
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
        store: RunStore | str | Path | None = None,
        token_counter: TokenCounter | None = None,
        listeners: Sequence[Listener] = (),
        approve_tools: Collection[str] = (),
        run_config: JsonObject | None = None,
        lease_ttl: float = 30.0,
        trace_content: bool | None = None,
        durability: Durability | None = None,
        prices: PriceTable | None = None,
        output_type: type[pydantic.BaseModel] | dict[str, Any] | None = None,
        text_listeners: Sequence[TextListener] = (),
        hooks: Sequence[object] = (),
        hook_timeout: float = 10.0,
    ) -> None:
        """`hooks`: objects with some of `before_model_call`, `after_model_call`,
        `before_tool_call`, `after_tool_call` (keel/hooks.py, ADR 0052), each call taking at
        most `hook_timeout` seconds.

        `durability`: "process" (the default) or "power" (each step's commit fsynced, so
        a power cut loses nothing committed; see `keel/durability.py`). It applies to the
        store the agent opens; a `Store` passed in keeps its own, and naming another is an
        error. `prices`: what model calls cost (keel/pricing.py) [default: the table Keel
        ships]. `output_type`: the shape of the answer, a pydantic model class or a JSON
        Schema; `RunResult.output` is then the validated answer (keel/structured.py).
        `text_listeners` hear the model's text as it is written (`TextDelta`,
        `TextDiscarded`; ADR 0039): with any, a transport that can stream does."""
        self.model_spec = model if isinstance(model, str) else None
        self.base_url = base_url
        self.transport = (
            resolve_model(model, base_url=base_url) if isinstance(model, str) else model
        )
        """The transport runs use. Built from a spec with a per-run position (a script), it
        serves the first run only: each later run gets its own (see `_run_transport`)."""
        self._transport_taken = False
        self.tools = [t if isinstance(t, Tool) else make_tool(t) for t in tools]
        self.limits = _with_model_defaults(limits or Limits(), self._model_name)
        self.output = None if output_type is None else OutputSpec.of(output_type)
        """The shape runs' answers must have; a resumed run keeps the one it started with."""
        self.prices = prices or PriceTable.shipped()
        self.price = self.prices.lookup(price_name(self.transport))
        """What this agent's model calls cost; None: no known price (no cost is kept)."""
        _check_priced(self.limits, self.price, self.transport)
        self.executor = ToolExecutor(self.tools, max_result_chars=self.limits.max_result_chars)
        self.system_prompt = system_prompt
        self.token_counter: TokenCounter | None = token_counter
        """None: the model's own tokenizer when its transport offers one, else an estimate."""
        self.listeners = tuple(listeners)
        if not hook_timeout > 0:
            raise ConfigError(f"hook_timeout must be a positive number of seconds ({hook_timeout})")
        self.hooks = Hooks.of(hooks, hook_timeout)
        self.text_listeners = tuple(text_listeners)
        self.approve_tools = frozenset(approve_tools)
        check_tool_names(self.approve_tools, {t.name for t in self.tools}, "approve_tools")
        self.run_config = dict(run_config or {})
        """Extra settings saved with each run (the command line keeps --repo and friends)."""
        self.lease_ttl = lease_ttl
        self.trace_content = capture_content(trace_content)
        """Put questions, answers, tool arguments and results in OpenTelemetry spans; None:
        as OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT says (off unless true)."""
        self._owns_store = not isinstance(store, RunStore)
        self._store_arg = store
        self._store: RunStore | None = store if isinstance(store, RunStore) else None
        if durability is not None:
            durability = check_durability(durability)
        passed = self._store.durability if isinstance(self._store, Store) else None
        if passed is not None and durability not in (None, passed):
            raise ConfigError(
                f"the store passed in was opened with durability {passed!r}: "
                f"open it with Store(..., durability={durability!r}) instead"
            )
        self.durability: Durability = durability or passed or "process"

    @property
    def store(self) -> RunStore:
        """Opened on first use, so constructing an Agent touches no disk. A path or a
        `postgresql://` URL; None: the SQLite file under the user data directory."""
        if self._store is None:
            arg = self._store_arg
            target = default_store_path() if arg is None else arg
            if isinstance(target, Path) or (isinstance(target, str) and not is_url(target)):
                self._store = Store(target, durability=self.durability)
            else:  # a postgresql:// URL: the Postgres store keeps its own commit policy
                self._store = open_store(str(target))
        return self._store

    def config(self, limits: Limits | None = None, settings: JsonObject | None = None) -> RunConfig:
        """What is saved with a run so any process can rebuild it (no secrets)."""
        return RunConfig(
            model=self._model_name,
            system_prompt=self.system_prompt,
            tools=tuple(t.name for t in self.tools),
            approve_tools=tuple(sorted(self.approve_tools)),
            limits=limits or self.limits,
            settings={**self.run_config, **(settings or {})},
        )

    def _setup(
        self,
        limits: Limits | None = None,
        listeners: Sequence[Listener] = (),
        settings: JsonObject | None = None,
        lease_owner: str | None = None,
        output: OutputSpec | None = None,
        follows: RunConfig | None = None,
        text_listeners: Sequence[TextListener] = (),
        store: RunStore | None = None,
        parent: tuple[str, str, str] | None = None,
    ) -> RunSetup:
        """`limits`: a resumed run's own, saved with it; else this agent's. `listeners` and
        `settings`: this run's own, beside the agent's. `lease_owner`: a lease the caller
        already holds on the run (a worker). `follows`: a config whose conversation the run
        belongs to (a follow-up's, or a resumed run's own). `store`: the run's store when not
        this agent's (a child's is its parent's). `parent`: a child run's parent run id, call
        id and agent name (keel/subagents.py)."""
        limits = _with_model_defaults(limits or self.limits, self._model_name)
        transport = self._run_transport()
        _check_priced(limits, self.price, transport)
        extra = dict(settings or {})
        if isinstance(transport, PinnedSampling):  # recorded, so `keel show` can say it
            extra["sampling"] = cast(JsonObject, dict(transport.sampling))
        output = output or self.output
        if output is not None:  # saved, so a resume in any process asks for the same shape
            extra.update(cast(JsonObject, output.settings()))
        config = self.config(limits, extra)
        if follows is not None:
            config = dataclasses.replace(
                config,
                conversation_id=follows.conversation_id,
                continues_from=follows.continues_from,
                parent_run=follows.parent_run,
                parent_call=follows.parent_call,
                agent=follows.agent,
            )
        if parent is not None:
            run, call, name = parent
            config = dataclasses.replace(config, parent_run=run, parent_call=call, agent=name)
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
            store=store or self.store,
            listeners=(*self.listeners, *listeners),
            approve_tools=self.approve_tools,
            config=config,
            lease_ttl=self.lease_ttl,
            lease_owner=lease_owner,
            price=self.price,
            output=output,
            text_listeners=(*self.text_listeners, *text_listeners),
            hooks=self.hooks,
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

    def start(
        self,
        question: str,
        *,
        listeners: Sequence[Listener] = (),
        conversation: str | None = None,
        text_listeners: Sequence[TextListener] = (),
    ) -> RunHandle:
        """Begin a run in the running event loop; returns at once. `listeners` hear this
        run's events, beside the agent's own; `text_listeners`, the model's text as it is
        written. `conversation`: a conversation's id (its first run's): the question is a
        follow-up on its newest run (see `start_ask`)."""
        follow = None
        if conversation is not None:
            latest = history.latest_run(self.store, conversation)
            follow = history.continuation(self.store, latest)
        return self._start(question, listeners, follow, text_listeners)

    def start_ask(
        self,
        run_id: str,
        question: str,
        *,
        fork: bool = False,
        listeners: Sequence[Listener] = (),
    ) -> RunHandle:
        """A follow-up question on a run that has ended (completed or failed): a new run, with
        its own id, limits and counters, whose history is the conversation so far as it was
        recorded (elisions kept). `fork`: continue from a run the conversation has already
        gone on from, as a new conversation. Raises ConfigError for a run that has not ended
        (resume it first) or is unknown."""
        follow = history.continuation(self.store, run_id, fork=fork)
        return self._start(question, listeners, follow)

    def _start(
        self,
        question: str,
        listeners: Sequence[Listener],
        follow: history.Continuation | None,
        text_listeners: Sequence[TextListener] = (),
    ) -> RunHandle:
        try:
            question.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ConfigError(
                f"the question is not valid text: it holds {exc.object[exc.start : exc.end]!r} "
                "(bytes that are not UTF-8?)"
            ) from None
        run_id = new_run_id()
        traced = _begin_trace(
            run_id,
            self._model_name,
            question,
            content=self.trace_content,
            server=server_of(self.transport),
        )
        extra = () if traced is None else (traced,)
        follows = None
        if follow is not None:
            follows = RunConfig(
                "", "", conversation_id=follow.conversation_id, continues_from=follow.continues_from
            )
        setup = self._setup(
            listeners=(*listeners, *extra),
            settings=traced.settings() if traced else None,
            follows=follows,
            text_listeners=text_listeners,
        )
        if follow is not None:
            setup.context.elided.update(follow.elided)
            setup.context.extend(follow.history)
        return _launch(RunLoop(run_id, question, setup), traced)

    def start_resume(
        self,
        run_id: str,
        *,
        listeners: Sequence[Listener] = (),
        lease_owner: str | None = None,
        text_listeners: Sequence[TextListener] = (),
        store: RunStore | None = None,
    ) -> RunHandle:
        """Continue a stored run that has not ended (paused, or its process died), from its
        last step: same counters, budgets spent and elisions. Raises ConfigError if the run is
        unknown or finished, LeaseHeld if another live process is advancing it. `store`: the
        run's store when not this agent's (a child run lives in its parent's)."""
        store = store or self.store
        point = history.resumed(store, resume.load(store, run_id))
        record = point.record
        traced = _begin_trace(
            run_id,
            self._model_name,
            record.question,
            settings=record.config.settings,
            content=self.trace_content,
            server=server_of(self.transport),
        )
        extra = () if traced is None else (traced,)
        origin = record.config.settings.get("forked_from")  # a fork resumed says it still
        setup = self._setup(
            record.config.limits,
            listeners=(*listeners, *extra),
            settings={"forked_from": origin} if isinstance(origin, dict) else None,
            lease_owner=lease_owner,
            output=self._output_of(record.config.settings),
            follows=record.config,
            text_listeners=text_listeners,
            store=store,
        )
        return _launch(RunLoop(run_id, record.question, setup, point), traced)

    def start_child(
        self,
        task: str,
        *,
        run_id: str,
        parent: tuple[str, str, str],
        limits: Limits,
        store: RunStore | None,
        listeners: Sequence[Listener] = (),
    ) -> RunHandle:
        """A child run on `task` (keel/subagents.py): `run_id` named after its parent's call,
        `parent` the parent's run id, call id and this agent's tool name, `limits` carved from
        the parent's, in the parent's `store`; `listeners` hear it (its parent's stream)."""
        traced = _begin_trace(
            run_id,
            self._model_name,
            task,
            content=self.trace_content,
            server=server_of(self.transport),
        )
        setup = self._setup(
            limits,
            listeners=(*listeners, *(() if traced is None else (traced,))),
            settings=traced.settings() if traced else None,
            store=store,
            parent=parent,
        )
        return _launch(RunLoop(run_id, task, setup), traced)

    def start_fork(
        self,
        run_id: str,
        *,
        at: int,
        listeners: Sequence[Listener] = (),
        text_listeners: Sequence[TextListener] = (),
    ) -> RunHandle:
        """A fork of stored run `run_id` at step `at` (as `keel show` numbers steps): a new
        run whose first `at` steps are the original's, copied from the store (no model call,
        no tool run, counters and elisions as they stood), then live with this agent's model,
        tools, limits and output shape (ADR 0051). The original is untouched. Raises
        ConfigError for an unknown run or a step that cannot be forked at."""
        from keel._run.fork import prefix_of_run

        prefix = prefix_of_run(self.store, run_id, at)
        return self.start_from_prefix(prefix, listeners=listeners, text_listeners=text_listeners)

    def start_from_prefix(
        self,
        prefix: ForkPrefix,
        *,
        listeners: Sequence[Listener] = (),
        text_listeners: Sequence[TextListener] = (),
    ) -> RunHandle:
        """A fork from a prefix already derived (`keel._run.fork`, or a recording's:
        `keel.replay.forks`): the run is created with the prefix's events, counters
        and elisions in one transaction, then continues as a resumed run does."""
        from keel._run.fork import resume_point

        run_id = new_run_id()
        traced = _begin_trace(
            run_id,
            self._model_name,
            prefix.question,
            content=self.trace_content,
            server=server_of(self.transport),
        )
        settings: JsonObject = {"forked_from": prefix.origin}
        if traced is not None:
            settings.update(traced.settings())
        follows = RunConfig("", "", continues_from=prefix.continues_from)
        setup = self._setup(
            listeners=(*listeners, *(() if traced is None else (traced,))),
            settings=settings,
            follows=follows,
            text_listeners=text_listeners,
        )
        store = setup.store
        assert store is not None
        point = resume_point(store, run_id, self._model_name, setup.config, prefix)
        loop = RunLoop(run_id, prefix.question, setup, point)

        async def create() -> None:
            await store.create_run(
                run_id,
                prefix.question,
                self._model_name,
                setup.config,
                prefix.state.copy(),
                lease=loop.lease.owner,
                lease_ttl=loop.lease.ttl,
                events=prefix.events,
                counters=prefix.counters,
                elisions=prefix.elisions,
            )

        return _launch(loop, traced, before=create)

    async def afork(self, run_id: str, *, at: int) -> RunResult:
        return self._typed(await _drive(self.start_fork(run_id, at=at)))

    def fork(self, run_id: str, *, at: int) -> RunResult:
        """Fork stored run `run_id` at step `at` onto this agent (see `start_fork`)."""
        return asyncio.run(self.afork(run_id, at=at))

    def as_tool(self, name: str, description: str) -> Tool:
        """This agent as a tool another agent can take in `tools=[...]`: each call runs it on
        the call's one argument, `{"task": "..."}`, as a child run of the caller's run, with
        this agent's model, tools, instructions and limits (capped by what the caller has
        left), and answers with the child's answer (keel/subagents.py, ADR 0046)."""
        from keel.subagents import delegation_tool

        return delegation_tool(self, name, description)

    def _output_of(self, settings: JsonObject) -> OutputSpec | None:
        """A stored run's output shape: this agent's own when it has the same schema (so the
        answer comes back as its pydantic model), else the schema saved with the run."""
        saved = OutputSpec.from_settings(dict(settings))
        if saved is None:
            return self.output
        if self.output is not None and self.output.schema == saved.schema:
            return self.output
        return saved

    def start_queued(self, run_id: str, *, lease_owner: str | None = None) -> RunHandle:
        """Start a run that `keel submit` recorded (status `queued`, nothing done yet)."""
        record = self.store.get_run(run_id)
        if record is None or record.status != "queued":
            found = record.status if record else "no such run"
            raise ConfigError(f"run {run_id} is not waiting to start ({found})")
        traced = _begin_trace(
            run_id,
            self._model_name,
            record.question,
            content=self.trace_content,
            server=server_of(self.transport),
        )
        extra = () if traced is None else (traced,)
        setup = self._setup(
            record.config.limits,
            listeners=extra,
            lease_owner=lease_owner,
            output=self._output_of(record.config.settings),
        )
        return _launch(RunLoop(run_id, record.question, setup, queued=True), traced)

    def stream(
        self, question: str, *, conversation: str | None = None, text: bool = True
    ) -> RunStream:
        """Run, and hear each typed event as it is recorded: ``async for event in
        agent.stream(q)``; then ``await`` the stream for the RunResult. `text`: also the
        model's text as it is written (`TextDelta`, `TextDiscarded`), where it can stream."""
        stream = RunStream()
        handle = self.start(
            question,
            listeners=(TreeListener(stream.listener),),
            conversation=conversation,
            text_listeners=(stream.listener,) if text else (),
        )
        return stream.follow(handle, handle._task)

    def stream_resume(self, run_id: str) -> RunStream:
        """`start_resume`, streamed: the events the resumed run records from here on."""
        stream = RunStream()
        handle = self.start_resume(
            run_id, listeners=(TreeListener(stream.listener),), text_listeners=(stream.listener,)
        )
        return stream.follow(handle, handle._task)

    @property
    def _model_name(self) -> str:
        return self.model_spec or self.transport.name

    async def arun(self, question: str, *, conversation: str | None = None) -> RunResult:
        return self._typed(await _drive(self.start(question, conversation=conversation)))

    def run(self, question: str, *, conversation: str | None = None) -> RunResult:
        """The blocking facade for scripts. `conversation`: a conversation's id (the
        `conversation_id` of a result): ask the question as a follow-up on its newest run."""
        _outside_a_loop("run", "arun")
        return asyncio.run(self.arun(question, conversation=conversation))

    async def aask(self, run_id: str, question: str, *, fork: bool = False) -> RunResult:
        return self._typed(await _drive(self.start_ask(run_id, question, fork=fork)))

    def ask(self, run_id: str, question: str, *, fork: bool = False) -> RunResult:
        """A follow-up question on an ended run (see `start_ask`)."""
        _outside_a_loop("ask", "aask")
        return asyncio.run(self.aask(run_id, question, fork=fork))

    async def aresume(self, run_id: str) -> RunResult:
        return self._typed(await _drive(self.start_resume(run_id)))

    def _typed(self, result: RunResult) -> RunResult:
        """The result with its structured answer as this agent's pydantic model."""
        if self.output is None or result.output is None:
            return result
        try:
            return replace(result, output=self.output.to_python(result.output))
        except pydantic.ValidationError:  # resumed under another schema: left as its JSON
            return result

    def resume(self, run_id: str) -> RunResult:
        _outside_a_loop("resume", "aresume")
        return asyncio.run(self.aresume(run_id))

    # -- approvals ---------------------------------------------------------------------------

    def pending_approvals(self, run_id: str) -> tuple[PendingApproval, ...]:
        return approvals.pending(self.store, run_id)

    def approve(
        self,
        run_id: str,
        call_id: str | None = None,
        *,
        by: str | None = None,
        arguments: dict[str, Any] | None = None,
        for_run: bool = False,
    ) -> list[str]:
        """Approve one pending call (by Keel's call id, as `pending_approvals` gives it), or
        all of them; `resume` then dispatches them. `arguments`: the whole edited arguments
        the call runs with instead (checked against the tool's schema first: ConfigError,
        nothing recorded, when they do not fit); `for_run`: later calls of the tool in this
        run need no approval. A decision is final: a call decided already raises
        AlreadyDecided, one whose approval timed out DecisionExpired (ADR 0052)."""
        return approvals.approve(
            self.store,
            run_id,
            call_id,
            by,
            arguments=arguments,
            for_run=for_run,
            validate=self._validate_arguments,
        )

    def answer(self, run_id: str, call_id: str, text: str, *, by: str | None = None) -> None:
        """Answer a pending call in place of its tool: `text` becomes its result, nothing is
        run, and the record says who answered. Final, like an approval."""
        approvals.answer(self.store, run_id, call_id, text, by)

    def _validate_arguments(self, name: str, arguments: Any) -> None:
        """Edited arguments checked by the tool itself (its pydantic model), when this agent
        has it; a child's tools are checked by the schema recorded with the call."""
        tool = self.executor.get(name)
        if tool is None:
            return
        try:
            tool.validate(arguments)
        except ToolError as invalid:
            raise ConfigError(
                f"the edited arguments do not fit {name}: {invalid}; nothing was recorded"
            ) from None

    def deny(self, run_id: str, call_id: str, *, reason: str, by: str | None = None) -> None:
        """Deny a pending call; the model is told who denied it and why, and not to retry.
        Final, like an approval: a call decided already raises AlreadyDecided."""
        approvals.deny(self.store, run_id, call_id, reason, by)

    def close(self) -> None:
        if self._owns_store and self._store is not None:
            self._store.close()
            self._store = None

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _begin_trace(
    run_id: str,
    model: str,
    question: str,
    *,
    settings: Mapping[str, Any] | None = None,
    content: bool = False,
    server: tuple[str, int] | None = None,
) -> RunTrace | None:
    """The run's trace (`RunTrace.begin`); None, without importing OpenTelemetry, when nothing
    could record a span (ADR 0042)."""
    if not tracing_possible():
        return None
    from keel.telemetry import RunTrace

    return RunTrace.begin(
        run_id, model, question, settings=settings, content=content, server=server
    )


def _launch(
    loop: RunLoop,
    traced: RunTrace | None,
    before: Callable[[], Awaitable[None]] | None = None,
) -> RunHandle:
    """`before`: what must be stored before the loop takes the run over (a fork's prefix)."""
    origin = loop.setup.config.settings.get("forked_from")
    if before is None and not isinstance(origin, dict):
        advance = loop.run
    else:

        async def advance() -> RunResult:
            if before is not None:
                await before()
            result = await loop.run()
            return replace(result, forked_from=origin) if isinstance(origin, dict) else result

    work = advance() if traced is None else traced.run(advance, loop.view)
    return RunHandle(loop, asyncio.ensure_future(work))


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
    if isinstance(transport, CountsTokens):  # the XML fallback over a server
        return transport.token_counter(), None
    return None, None


def _with_model_defaults(limits: Limits, model: str) -> Limits:
    """`limits` with what was left to the model decided for it: whether the first turn must
    call a tool (`first_turn_tool` None: yes for the local model, which otherwise answers from
    nothing), so `Agent(model="local")` and `keel run --model local` behave alike."""
    if limits.first_turn_tool is not None:
        return limits
    return replace(limits, first_turn_tool=first_turn_tool_default(model))


def _check_priced(limits: Limits, price: Price | None, transport: Transport) -> None:
    """A cost limit needs a price: without one the limit would count a silent zero."""
    if limits.max_cost is None or price is not None:
        return
    name = price_name(transport)
    raise ConfigError(
        f"no price is known for the model {name}, so a cost limit (max_cost) cannot be kept; "
        "add its price under [prices.PROVIDER] in keel.toml or pass Agent(prices=...), or run "
        "without the cost limit"
    )


def new_run_id() -> str:
    return "run_" + uuid.uuid4().hex[:16]


def _outside_a_loop(blocking: str, awaitable: str) -> None:
    """The blocking facade runs its own event loop, so it cannot run inside one (an async web
    endpoint, a Jupyter cell): refused, before any run starts, with the awaitable to use."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise ConfigError(
        f"agent.{blocking}() was called inside a running event loop (an async function, an "
        f"async web endpoint, a Jupyter cell); there, use `await agent.{awaitable}(...)`"
    )
