"""The library's front door: `Agent(model=..., tools=[...], limits=Limits(...)).run(question)`.

The command line is a thin layer over this class; both produce the same RunResult.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Collection, Generator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pydantic

from keel import approvals
from keel._run import (
    ContextBuilder,
    FollowUp,
    ForkOf,
    Fresh,
    Listener,
    Opened,
    Opening,
    Resumed,
    RunLoop,
    RunSetup,
    create_fork,
    fork_point,
    new_run_id,
)
from keel.durability import Durability, check_durability
from keel.errors import ConfigError, ToolError
from keel.events import RunStream, TreeListener
from keel.hooks import Hooks
from keel.hosted import HostedTool, hosted_tools_from
from keel.limits import Limits
from keel.models import first_turn_tool_default, resolve_model
from keel.pricing import Price, PriceTable, price_name
from keel.records import JsonObject, RunConfig
from keel.result import PendingApproval, RunResult
from keel.setting_checks import check_tool_names
from keel.store import RunStore, Store, open_store
from keel.store.locate import default_store_path, is_url
from keel.structured import OutputSpec
from keel.tokens import EstimatingCounter, TokenCounter
from keel.tools.base import Tool, make_tool
from keel.tools.executor import ToolExecutor
from keel.tools.read_back import READ_BACK_NAME, read_back_tool
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
from keel.windows import SCRIPTED_WINDOW, ModelWindow, context_budget, local_window, window_for

if TYPE_CHECKING:  # imported for a run that may be traced (`_begin_trace`)
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
        hosted_tools: Sequence[HostedTool | str] = (),
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
        `TextDiscarded`; ADR 0039): with any, a transport that can stream does.
        `hosted_tools`: tools the model's provider runs itself (``"web_search"``, a
        `keel.HostedTool`; ADR 0067), for an ``openai:`` or ``anthropic:`` spec; a transport
        passed in is built with its own (``hosted_tools=`` of the transport)."""
        self.model_spec = model if isinstance(model, str) else None
        self.base_url = base_url
        hosted = hosted_tools_from(hosted_tools)
        if hosted and not isinstance(model, str):
            raise ConfigError(
                "hosted_tools go with a model spec; a transport passed in declares its own "
                "(e.g. AnthropicTransport(..., hosted_tools=[HostedTool('web_search')]))"
            )
        self._hosted = hosted
        self.transport = (
            resolve_model(model, base_url=base_url, hosted_tools=hosted)
            if isinstance(model, str)
            else model
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
        _check_hosted(self.transport, self.tools, self.limits, self.price)
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
        opened: Opened,
        listeners: Sequence[Listener],
        settings: JsonObject,
        text_listeners: Sequence[TextListener],
    ) -> RunSetup:
        """What the run opened with, and this agent's parts: its model, tools, context builder
        (sized to the model's window), the run's own limits or this agent's, its output shape
        (a stored run keeps the one it started with), listeners and store."""
        limits = _with_model_defaults(opened.limits or self.limits, self._model_name)
        transport = self._run_transport()
        _check_priced(limits, self.price, transport)
        extra = dict(settings)
        if isinstance(transport, PinnedSampling):  # recorded, so `keel show` can say it
            extra["sampling"] = cast(JsonObject, dict(transport.sampling))
        output = self.output if opened.stored is None else self._output_of(opened.stored)
        if output is not None:  # saved, so a resume in any process asks for the same shape
            extra.update(cast(JsonObject, output.settings()))
        window = _window(transport, limits)
        budget = context_budget(limits.context_tokens, window, WINDOW_MARGIN)
        extra["window"] = {"tokens": window.context, "answer": window.output, "budget": budget}
        config = self.config(limits, extra).with_lineage(opened.lineage)
        result_cap = limits.max_result_chars
        limit = None
        if window is not SCRIPTED_WINDOW:  # a window is hard: stay inside it (issue 44)
            limit = max(budget, window.prompt_room - WINDOW_MARGIN)
            result_cap = min(result_cap, max(100, budget * CHARS_PER_TOKEN // RESULTS_PER_WINDOW))
        store = opened.store or self.store
        context = ContextBuilder(
            self.system_prompt,
            self.executor.definitions,
            self.token_counter or _tokenizer(transport) or EstimatingCounter(),
            budget=budget,
            limit=limit,
            ceiling=None if limit is None else window.prompt_room,
        )
        tools = self.tools
        if limits.read_back and self.executor.get(READ_BACK_NAME) is None:
            read_back = read_back_tool(_reader(context, store), result_cap)
            context.read_back, tools = read_back.definition(), [*tools, read_back]
        if opened.follow is not None:  # a follow-up starts with the conversation so far
            context.elided.update(opened.follow.elided)
            context.extend(opened.follow.history)
        return RunSetup(
            transport=transport,
            executor=self.executor
            if tools is self.tools and result_cap == self.executor.max_result_chars
            else ToolExecutor(tools, max_result_chars=result_cap),
            limits=limits,
            context=context,
            store=store,
            listeners=(*self.listeners, *listeners),
            approve_tools=self.approve_tools,
            config=config,
            lease_ttl=self.lease_ttl,
            lease_owner=opened.lease_owner,
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
        return resolve_model(self.model_spec, base_url=self.base_url, hosted_tools=self._hosted)

    def launch(
        self,
        opening: Opening,
        *,
        listeners: Sequence[Listener] = (),
        text_listeners: Sequence[TextListener] = (),
    ) -> RunHandle:
        """Open a run (`keel._run.openings`: Fresh, FollowUp, Resumed, Queued, Child, Forked,
        ForkOf) and start it in the running event loop; returns at once. The only place a run
        is traced, set up and started. `listeners` hear this run's events, beside the agent's
        own; `text_listeners`, the model's text as it is written. Raises ConfigError for a run
        that cannot be opened (unknown, ended, not queued), LeaseHeld when another live process
        advances it."""
        opened = opening.open(self.store)
        traced = _begin_trace(
            opened.run_id,
            self._model_name,
            opened.question,
            settings=opened.trace_from,
            content=self.trace_content,
            server=server_of(self.transport),
            agent=opened.lineage.agent,
        )
        settings = dict(opened.settings)
        if traced is not None and opened.is_new:  # saved, so a resume continues the trace
            settings.update(traced.settings())
        setup = self._setup(
            opened, (*listeners, *(() if traced is None else (traced,))), settings, text_listeners
        )
        point, before = opened.point, None
        if opened.fork is not None:
            point = fork_point(
                setup.store, opened.run_id, self._model_name, setup.config, opened.fork
            )
        loop = RunLoop(opened.run_id, opened.question, setup, point, queued=opened.queued)
        if opened.fork is not None:
            before = functools.partial(create_fork, loop, opened.fork)
        return _launch(loop, traced, before)

    def start(
        self,
        question: str,
        *,
        listeners: Sequence[Listener] = (),
        conversation: str | None = None,
        text_listeners: Sequence[TextListener] = (),
    ) -> RunHandle:
        """Begin a run in the running event loop; returns at once. `conversation`: a
        conversation's id (its first run's): the question is a follow-up on its newest run."""
        opening = Fresh(question, conversation)
        return self.launch(opening, listeners=listeners, text_listeners=text_listeners)

    def start_resume(
        self,
        run_id: str,
        *,
        listeners: Sequence[Listener] = (),
        text_listeners: Sequence[TextListener] = (),
    ) -> RunHandle:
        """Continue a stored run that has not ended (paused, or its process died), from its
        last step: same counters, budgets spent and elisions."""
        return self.launch(Resumed(run_id), listeners=listeners, text_listeners=text_listeners)

    async def afork(self, run_id: str, *, at: int) -> RunResult:
        return self._typed(await _drive(self.launch(ForkOf(run_id, at))))

    def fork(self, run_id: str, *, at: int) -> RunResult:
        """Fork stored run `run_id` at step `at` (as `keel show` numbers steps) onto this agent:
        a new run whose first `at` steps are the original's, copied from the store (no model
        call, no tool run), then live with this agent's model, tools, limits and output shape
        (ADR 0051). The original is untouched."""
        _outside_a_loop("fork", "afork")
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
        handle = self.launch(
            Resumed(run_id),
            listeners=(TreeListener(stream.listener),),
            text_listeners=(stream.listener,),
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
        return self._typed(await _drive(self.launch(FollowUp(run_id, question, fork))))

    def ask(self, run_id: str, question: str, *, fork: bool = False) -> RunResult:
        """A follow-up question on an ended run (see `start_ask`)."""
        _outside_a_loop("ask", "aask")
        return asyncio.run(self.aask(run_id, question, fork=fork))

    async def aresume(self, run_id: str) -> RunResult:
        return self._typed(await _drive(self.launch(Resumed(run_id))))

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

    def cancel(self, run_id: str) -> list[str]:
        """Cancel a stored run and every run below it (its children, theirs), durably: a run
        nobody advances ends `cancelled` at once; one a live process advances (this one or
        another) is stopped by it within half a second, its in-flight calls cancelled; a child
        started after this ends `cancelled` before it calls its model (ADR 0066). Returns the
        ids of the tree's runs that had not ended. `resume` continues a cancelled run."""
        return self.store.request_cancel(run_id)

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
    agent: str | None = None,
) -> RunTrace | None:
    """The run's trace (`RunTrace.begin`); None, without importing OpenTelemetry, when nothing
    could record a span (ADR 0042). `agent`: a child run's agent (its delegation tool's name)."""
    if not tracing_possible():
        return None
    from keel.telemetry import RunTrace

    return RunTrace.begin(
        run_id, model, question, settings=settings, content=content, server=server, agent=agent
    )


def _launch(
    loop: RunLoop,
    traced: RunTrace | None,
    before: Callable[[], Awaitable[None]] | None,
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
"""Where a window binds, one tool result is cut to a quarter of the context budget (its whole
text kept for `read_result`), so one batch rarely needs clamping to fit the window."""


def _window(transport: Transport, limits: Limits) -> ModelWindow:
    """The run's window (keel/windows.py): a loaded local model's own (directly, or under the
    XML fallback, which forwards it; loading it now: the run needs it anyway), else the
    configured, shipped or default one for the model."""
    if isinstance(transport, LocalModel):
        return local_window(transport)
    return window_for(price_name(transport), limits.context_window)


def _tokenizer(transport: Transport) -> TokenCounter | None:
    """The model's own tokenizer when its transport offers one (a local model, the XML
    fallback's calibrated estimate over a server)."""
    if isinstance(transport, LocalModel | CountsTokens):
        return transport.token_counter()
    return None


def _reader(context: ContextBuilder, store: RunStore) -> Callable[[str], str | None]:
    """What `read_result` reads: a result of the run's history by its id, whole (a truncated
    one's whole text from the store)."""

    def find(ref: str) -> str | None:
        result = context.result(ref)
        if result is None:
            return None
        if result.truncated:
            whole = store.blob(result.digest)
            if whole is not None:
                return whole
        return result.content

    return find


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


def _check_hosted(
    transport: Transport, tools: Sequence[Tool], limits: Limits, price: Price | None
) -> None:
    """Hosted tools (ADR 0067) share the model's tool names, so none may be named as a tool of
    the agent's; under a cost limit each must have a price per call."""
    hosted: Sequence[HostedTool] = getattr(transport, "hosted_tools", ())
    clash = sorted({h.kind for h in hosted} & {t.name for t in tools})
    if clash:
        raise ConfigError(
            f"the hosted tool {clash[0]} and the agent's own tool {clash[0]} have one name: "
            f"offer one of them (e.g. --search or --hosted-tool {clash[0]}, not both)"
        )
    if limits.max_cost is None or price is None:
        return
    unpriced = [h.kind for h in hosted if price.hosted(h.kind) is None]
    if unpriced:
        raise ConfigError(
            f"no price per call is known for the hosted tool {unpriced[0]}, so a cost limit "
            "(max_cost) cannot be kept; add it under [prices.hosted.PROVIDER] in keel.toml "
            "or pass Agent(prices=...), or run without the cost limit"
        )


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
