"""Running a scenario for real; `keel.evals.judging` says how it ended.

Nothing is simulated below the model: each run starts its own page server, builds the real web
(and file, and browser) tools, a real Agent with the scenario's limits and a store, and runs the
question. Only the model is scripted, unless ``--model`` names a real one. The result row records
what an expectation can be checked against: the end of the run, the calls, the events that show
a rule at work (evidence resets, elided results), the requests each page received (so "nothing
was dispatched" is observed at the server, not inferred from the runtime's own account), and the
scripted turns left unused.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from keel._run import NUDGE_PREFIX
from keel.agent import Agent, RunHandle
from keel.errors import ConfigError
from keel.evals.documents import document_html
from keel.evals.grading import echoed_controls, grade, repo_problems
from keel.evals.judging import RunRow, ScenarioReport, actual_end, check, expected_end
from keel.evals.page_specs import (
    ChangingPage,
    DocumentPage,
    ErrorPage,
    LargePage,
    Page,
    ProgressPage,
    RedirectPage,
    ScriptPage,
    SearxngPage,
    SettlingPage,
    SlowPage,
    StaticPage,
)
from keel.evals.pageserver import PageServer
from keel.evals.refusals import with_refusals
from keel.evals.scenario import (
    BROWSER_TOOLS,
    FILE_TOOLS,
    WEB_TOOLS,
    WRITE_TOOLS,
    Expect,
    Scenario,
    ScenarioSpec,
)
from keel.limits import Limits
from keel.models import resolve_model
from keel.records import (
    ApprovalRequested,
    Event,
    EvidenceReset,
    ModelRequestSent,
    ResultElided,
    RunResumed,
    ToolCallRequested,
)
from keel.result import RunResult
from keel.store import RunStore
from keel.tools.base import Tool
from keel.tools.files import file_tools
from keel.tools.web import web_tools
from keel.tools.writes import write_tools
from keel.transports.base import Transport
from keel.transports.scripted import ScriptedTransport

__all__ = [
    "RunRow",
    "ScenarioReport",
    "actual_end",
    "build_tools",
    "check",
    "expected_end",
    "make_transport",
    "nudges",
    "run_once",
    "run_scenarios",
    "serve",
    "substitute",
]

ALLOW_HOSTS = ("127.0.0.1",)
Closer = Callable[[], Awaitable[None]]


# --- one run --------------------------------------------------------------------------------


def substitute(value: Any, base: str) -> Any:
    """``{base}`` in every string of a parsed script or question becomes the server's URL."""
    if isinstance(value, str):
        return value.replace("{base}", base)
    if isinstance(value, list):
        return [substitute(v, base) for v in value]
    if isinstance(value, dict):
        return {k: substitute(v, base) for k, v in value.items()}
    return value


def serve(server: PageServer, pages: Sequence[Page], base: str) -> None:
    for page in pages:
        path = page.path
        match page:
            case StaticPage():
                server.add_page(path, page.body, page.content_type, page.status)
            case ChangingPage():
                server.add_changing(path, page.template)
            case ProgressPage():
                server.add_progress(path, page.steps, page.done)
            case SettlingPage():
                server.add_settling(path, page.settle_after, page.template)
            case LargePage():
                server.add_large(path, page.size_kb * 1024, page.topic, page.title)
            case DocumentPage():
                facts = [(f.text, f.at) for f in page.facts]
                size = page.size_kb * 1024
                body = document_html(size, seed=page.seed, title=page.title, facts=facts)
                server.add_page(path, body)
            case SlowPage():
                server.add_slow(path, page.seconds, page.body)
            case ErrorPage():
                server.add_error(path, page.status, page.body)
            case ScriptPage():
                server.add_script_page(
                    path,
                    interval_ms=page.interval_ms,
                    ticks=page.ticks,
                    text=page.text,
                    title=page.title,
                )
            case RedirectPage():
                server.add_redirect(path, substitute(page.location, base), page.status)
            case SearxngPage():
                found = [substitute(r.model_dump(), base) for r in page.results]
                server.add_searxng(path, found)


def build_tools(
    spec: ScenarioSpec, folder: Path, repo: Path | None = None, base: str = ""
) -> tuple[list[Tool], list[Closer]]:
    """The scenario's tools, in the order it names them, and what must be closed after. A repo
    question gets `keel run`'s tools (the file tools, then the web tools) on `repo`. `base`:
    the page server's address, for a search backend on it."""
    if spec.fact is not None:
        names = spec.tools.names or [*FILE_TOOLS, *WEB_TOOLS]
    else:
        names = spec.tools.names or [
            *WEB_TOOLS,
            *(FILE_TOOLS if spec.files or spec.documents else ()),
        ]
    pool: dict[str, Tool] = {}
    closers: list[Closer] = []
    if set(names) & set(WEB_TOOLS):
        web = web_tools(
            allow_hosts=ALLOW_HOSTS,
            timeout=spec.tools.timeout,
            max_download_bytes=spec.tools.max_download_bytes,
        )
        pool.update((t.name, t) for t in web)
    if spec.fact is not None and set(names) & set(FILE_TOOLS):
        pool.update((t.name, t) for t in file_tools(repo or Path(".")))
    elif set(names) & {*FILE_TOOLS, *WRITE_TOOLS}:
        _write_files(spec, folder)
        pool.update((t.name, t) for t in file_tools(folder))
        writes = write_tools(folder)  # approval only where [approvals] require asks for it
        pool.update((t.name, dataclasses.replace(t, requires_approval=False)) for t in writes)
    if set(names) & set(BROWSER_TOOLS):
        from keel.tools.browser import browser_tools

        browser = browser_tools(
            allow_hosts=ALLOW_HOSTS,
            executable_path=spec.tools.browser_executable,
            timeout=spec.tools.timeout,
        )
        pool.update((t.name, t) for t in browser)
        closers.append(browser.close)
    if "web_search" in names and spec.tools.search is not None:
        from keel.evals.searching import search_tool

        _write_files(spec, folder)
        pool["web_search"] = search_tool(
            spec.tools.search, base=base, folder=folder, allow_hosts=ALLOW_HOSTS
        )
    required = set(spec.approvals.require)
    tools = [
        dataclasses.replace(pool[name], requires_approval=True) if name in required else pool[name]
        for name in names
    ]
    return tools, closers


def _write_files(spec: ScenarioSpec, folder: Path) -> None:
    """The scenario's files under `folder`, for the file tools and a local search index."""
    for rel, text in spec.all_files().items():
        target = folder / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")


def child_tools(
    spec: ScenarioSpec, tools: list[Tool], base: str, store: RunStore, folder: Path
) -> list[Tool]:
    """The scenario's child agents as delegation tools (sub-agents, ADR 0046): each with its
    own script, read from its start by every child run (a `script:` file in `folder`), and
    the scenario's tools it names."""
    by_name = {t.name: t for t in tools}
    made = []
    for name, child in spec.agents.items():
        unknown = sorted(set(child.tools) - set(by_name))
        if unknown:
            raise ConfigError(f"agents.{name}.tools: not a tool of this scenario: {unknown}")
        script = folder / f"agent-{name}.json"
        script.write_text(json.dumps(substitute(child.script, base)), encoding="utf-8")
        agent = Agent(
            f"script:{script}",
            tools=[by_name[t] for t in child.tools],
            limits=Limits(**child.limits.model_dump()),
            store=store,
        )
        made.append(agent.as_tool(name, child.description))
    return made


def make_transport(scenario: Scenario, model: str | None, base: str) -> Transport:
    if model is not None:
        return resolve_model(model)
    if scenario.spec.script is None:
        raise ConfigError(
            f"scenario {scenario.name} ({scenario.source}) has no script; "
            "run it against a model with --model SPEC"
        )
    script = substitute(scenario.spec.script, base)
    refusals = scenario.spec.refusals
    if refusals is not None and scenario.limits.context_window is not None:
        window = scenario.limits.context_window
        script = with_refusals(script, refusals.wordings, refusals.seed, window, refusals.after)
    return ScriptedTransport.from_dict(script, scenario.source, record=True)


def nudges(transport: Transport) -> int:
    """Requests of a scripted run that carried the nudge (docs/adr/0050): its note is never
    stored, so only the requests show it; 0 for any other transport."""
    if not isinstance(transport, ScriptedTransport):
        return 0
    return sum(
        any(note.startswith(NUDGE_PREFIX) for note in request.volatile)
        for request in transport.requests
    )


class _EventCounts:
    """A listener: how often each event type occurred in the run."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.calls: list[str] = []
        """Each tool call requested, as `name {arguments}`."""
        self.largest_request = 0
        """Tokens of the largest request sent, as Keel counted them."""

    def __call__(self, event: Event) -> None:
        self.counts[event.type] += 1
        if isinstance(event, ModelRequestSent):
            self.largest_request = max(self.largest_request, event.estimated_input_tokens)
        if isinstance(event, ToolCallRequested):
            shown = json.dumps(event.arguments, ensure_ascii=False, sort_keys=True)
            self.calls.append(f"{event.name} {shown}")


async def run_once(
    scenario: Scenario,
    *,
    model: str | None,
    store: RunStore,
    repeat: int = 1,
    repo: Path | None = None,
    shared: Transport | None = None,
) -> RunRow:
    """Run the scenario once, for real, and judge it. `repo`: the repository a repo question
    reads (default: the current folder). `shared`: a loaded local model every run uses (and
    none closes), instead of one per run."""
    spec = scenario.spec
    live = model is not None
    expect = spec.expect_live if live else spec.expect
    repo = (repo or Path(".")).resolve()
    fact = None if spec.fact is None else spec.fact.expected(repo)  # ConfigError: misuse
    started = time.perf_counter()
    counts = _EventCounts()
    with PageServer() as server, tempfile.TemporaryDirectory(prefix="keel-eval-") as tmp:
        base = server.base_url
        serve(server, spec.pages, base)
        transport = shared or make_transport(scenario, model, base)
        tools, closers = build_tools(spec, Path(tmp), repo, base)
        tools += child_tools(spec, tools, base, store, Path(tmp))

        def agent_on(model_transport: Transport) -> Agent:
            return Agent(
                model_transport,
                tools=tools,
                limits=scenario.limits,
                store=store,
                listeners=[counts],
            )

        nudged = 0
        try:
            agent = agent_on(transport)
            result, stuck = await _run_with_timeout(
                agent, lambda: agent.start(substitute(spec.question, base)), spec
            )
            for decision in spec.approvals.decisions:
                if result.status != "awaiting_approval" or stuck:
                    break
                for pending in agent.pending_approvals(result.run_id):
                    if decision.decision == "approve":
                        agent.approve(result.run_id, pending.call_id, by=decision.by)
                    else:
                        agent.deny(
                            result.run_id,
                            pending.call_id,
                            reason=decision.reason or "denied by the evaluation",
                            by=decision.by,
                        )
                if shared is None:
                    nudged += nudges(transport)
                    _release(transport)
                    transport = make_transport(scenario, model, base)  # a new process, anew
                agent = agent_on(transport)
                result, stuck = await _run_with_timeout(
                    agent, functools.partial(agent.start_resume, result.run_id), spec
                )
        finally:
            if shared is None:
                _release(transport)
            for close in closers:
                await close()
        hits = {page.path: server.hits(page.path) for page in spec.pages}
    scripted = isinstance(transport, ScriptedTransport) and not live
    unused = transport.remaining if isinstance(transport, ScriptedTransport) and not live else None
    row = RunRow(
        scenario=scenario.name,
        repeat=repeat,
        expected=expected_end(expect) if expect else "any end",
        actual=actual_end(result),
        passed=False,
        problems=[],
        model_calls=result.model_calls,
        tool_calls=result.tool_calls,
        synthesized=result.synthesized,
        cost=result.cost,
        evidence_resets=counts.counts[EvidenceReset.type],
        results_elided=counts.counts[ResultElided.type],
        events=dict(counts.counts),
        largest_request=counts.largest_request,
        approvals_requested=counts.counts[ApprovalRequested.type],
        resumes=counts.counts[RunResumed.type],
        page_hits=hits,
        unused_turns=unused,
        nudges=nudged + nudges(transport) if scripted else None,
        seconds=round(time.perf_counter() - started, 3),
        run_id=result.run_id,
        answer=result.answer,
        failure=None if result.failure is None else result.failure.to_dict(),
        evidence=result.evidence,
    )
    if stuck:
        row.problems.append(f"the run did not end within {spec.timeout:g}s and was cancelled")
    if expect is not None:
        row.problems += check(expect, row, result)
    row.problems += [
        f"answer repeats the synthesis control: {s!r}" for s in echoed_controls(result.answer)
    ]
    if fact is not None:
        row.problems += repo_problems(fact, result.answer or "", repo)
    row.calls = counts.calls
    row.grade = grade(result, stuck, row.problems)
    row.passed = not row.problems and (fact is None or row.grade == "right")
    return row


def _release(transport: Transport) -> None:
    """A local model keeps its weights and KV cache until closed; each run builds its own, so
    thirty-five live runs would otherwise hold thirty-five models (4.6 GB seen at run 18)."""
    from keel.transports.local import LocalTransport  # loads nothing

    if isinstance(transport, LocalTransport):
        transport.close()


async def _run_with_timeout(
    agent: Agent, start: Callable[[], RunHandle], spec: ScenarioSpec
) -> tuple[RunResult, bool]:
    """The run's result, and whether it had to be cancelled for outliving the timeout.

    A stuck run is cancelled the runtime's own way, so it still ends with a RunResult."""
    handle = start()
    waiter: asyncio.Future[RunResult] = asyncio.ensure_future(handle)
    done, _ = await asyncio.wait({waiter}, timeout=spec.timeout)
    if done:
        return waiter.result(), False
    handle.cancel()
    return await waiter, True


def _error_row(scenario: Scenario, repeat: int, expect: Expect | None, exc: Exception) -> RunRow:
    return RunRow(
        scenario=scenario.name,
        repeat=repeat,
        expected=expected_end(expect) if expect else "any end",
        actual="error",
        passed=False,
        problems=[f"the evaluation could not run: {type(exc).__name__}: {exc}"],
    )


async def run_scenarios(
    scenarios: Sequence[Scenario],
    *,
    model: str | None = None,
    repeat: int = 1,
    store: RunStore,
    on_row: Callable[[RunRow], None] | None = None,
    repo: Path | None = None,
) -> list[ScenarioReport]:
    """Every scenario, `repeat` times each, one run at a time (runs must not share a CPU
    budget: several evaluate timing). Misuse (a scenario without a script and no model, a bad
    model spec) raises ConfigError before anything runs; anything else that goes wrong while
    running one becomes a failed row, and the others still run."""
    if repeat < 1:
        raise ConfigError(f"--repeat must be at least 1 (got {repeat})")
    for s in scenarios:
        if model is None:
            make_transport(s, None, "http://127.0.0.1")
        if set(s.spec.tools.names or ()) & set(BROWSER_TOOLS):
            from keel.tools.browser import browser_tools

            browser_tools(executable_path=s.spec.tools.browser_executable)  # present?
        if s.spec.fact is not None:
            s.spec.fact.expected((repo or Path(".")).resolve())  # readable here?
    shared = None if model is None else _shared(resolve_model(model))
    try:
        return await _run_all(scenarios, model, repeat, store, on_row, repo, shared)
    finally:
        if shared is not None:
            _release(shared)


def _shared(transport: Transport) -> Transport | None:
    """The local model, loaded once for every run of the evaluation, so its prompt cache keeps
    the prefix every run shares (the system text and tools, ~1,100 tokens: 23 s to read on two
    busy cores). Every other transport is built anew for each run."""
    from keel.transports.local import LocalTransport  # loads nothing

    return transport if isinstance(transport, LocalTransport) else None


async def _run_all(
    scenarios: Sequence[Scenario],
    model: str | None,
    repeat: int,
    store: RunStore,
    on_row: Callable[[RunRow], None] | None,
    repo: Path | None,
    shared: Transport | None,
) -> list[ScenarioReport]:
    reports: list[ScenarioReport] = []
    for scenario in scenarios:
        rows: list[RunRow] = []
        expect = scenario.spec.expect_live if model else scenario.spec.expect
        for n in range(1, repeat + 1):
            try:
                row = await run_once(
                    scenario, model=model, store=store, repeat=n, repo=repo, shared=shared
                )
            except ConfigError:
                raise
            except Exception as exc:
                row = _error_row(scenario, n, expect, exc)
            rows.append(row)
            if on_row is not None:
                on_row(row)
        reports.append(ScenarioReport(scenario, rows))
    return reports
