"""Running a scenario for real and judging how it ended.

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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from keel.agent import Agent, RunHandle
from keel.errors import ConfigError
from keel.evals.grading import Grade, echoed_controls, grade, repo_problems
from keel.evals.pageserver import PageServer
from keel.evals.scenario import (
    BROWSER_TOOLS,
    FILE_TOOLS,
    WEB_TOOLS,
    WRITE_TOOLS,
    Bounds,
    ChangingPage,
    Count,
    ErrorPage,
    Expect,
    LargePage,
    Page,
    ProgressPage,
    RedirectPage,
    Scenario,
    ScenarioSpec,
    ScriptPage,
    SettlingPage,
    SlowPage,
    StaticPage,
)
from keel.models import resolve_model
from keel.records import (
    ApprovalRequested,
    Event,
    EvidenceReset,
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
    "run_once",
    "run_scenarios",
    "serve",
    "substitute",
]

ALLOW_HOSTS = ("127.0.0.1",)
Closer = Callable[[], Awaitable[None]]


@dataclass(slots=True)
class RunRow:
    """One run of one scenario, and whether it met the expectation."""

    scenario: str
    repeat: int
    """1-based."""
    expected: str
    actual: str
    """How the run ended: "answer", "synthesized: <reason>", a failure kind, "cancelled",
    "awaiting approval", or "error" when the evaluation itself could not run it."""
    passed: bool
    problems: list[str]
    model_calls: int = 0
    tool_calls: int = 0
    synthesized: str | None = None
    cost: float | None = None
    """US dollars the run's model calls cost; None: no known price for its model."""
    evidence_resets: int = 0
    results_elided: int = 0
    approvals_requested: int = 0
    resumes: int = 0
    page_hits: dict[str, int] = field(default_factory=dict)
    unused_turns: int | None = None
    """Scripted turns left unused; None with a real model."""
    seconds: float = 0.0
    run_id: str | None = None
    answer: str | None = None
    failure: dict[str, Any] | None = None
    grade: Grade = "wrong"
    """"right", "wrong" (it names something false or misses what is required) or "cut off"
    (a limit ended it, not the model: the output limit, a budget, the deadline, a failure)."""
    calls: list[str] = field(default_factory=list)
    """The run's tool calls, as `name {arguments}`, in order."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class ScenarioReport:
    """All repeats of one scenario."""

    scenario: Scenario
    rows: list[RunRow]

    @property
    def passed(self) -> bool:
        return all(row.passed for row in self.rows)

    @property
    def outcomes(self) -> Counter[str]:
        """How often runs ended each way: the figure that matters with a real model."""
        return Counter(row.actual for row in self.rows)


# --- how runs end ---------------------------------------------------------------------------


def expected_end(expect: Expect) -> str:
    if expect.status == "completed":
        if expect.synthesized is False:
            return "answer"
        return f"synthesized: {expect.synthesized}" if expect.synthesized else "completed"
    if expect.status == "failed":
        return expect.failure or "failed"
    return expect.status.replace("_", " ")


def actual_end(result: RunResult) -> str:
    if result.status == "completed":
        return f"synthesized: {result.synthesized}" if result.synthesized else "answer"
    if result.status == "failed":
        return result.failure.kind if result.failure else "failed"
    return result.status.replace("_", " ")


def _count_problem(what: str, value: int, want: Count | None) -> str | None:
    if want is None:
        return None
    if isinstance(want, Bounds):
        return None if want.check(value) else f"{what}: {value}, expected {want}"
    return None if value == want else f"{what}: {value}, expected {want}"


def check(expect: Expect, row: RunRow, result: RunResult) -> list[str]:
    """Every way the run missed the expectation, each as a sentence; empty when it passed."""
    problems: list[str] = []
    end, want = row.actual, expected_end(expect)
    status_ok = result.status == expect.status
    failure_ok = expect.failure is None or (
        result.failure is not None and result.failure.kind == expect.failure
    )
    synth_ok = expect.synthesized is None or (result.synthesized or False) == expect.synthesized
    if not (status_ok and failure_ok and synth_ok):
        why = f" ({result.failure.message})" if result.failure else ""
        problems.append(f"ended with {end}, expected {want}{why}")
    counts = (
        ("model calls", row.model_calls, expect.model_calls),
        ("tool calls", row.tool_calls, expect.tool_calls),
        ("evidence resets", row.evidence_resets, expect.evidence_resets),
        ("results elided", row.results_elided, expect.results_elided),
        ("approvals requested", row.approvals_requested, expect.approvals_requested),
        ("resumes", row.resumes, expect.resumes),
        *((f"requests to {p}", row.page_hits.get(p, 0), c) for p, c in expect.page_hits.items()),
    )
    for what, value, bound in counts:
        if (problem := _count_problem(what, value, bound)) is not None:
            problems.append(problem)
    answer = (result.answer or "").casefold()
    problems += [
        f"answer lacks {t!r}" for t in expect.answer_contains if t.casefold() not in answer
    ]
    problems += [f"answer contains {t!r}" for t in expect.answer_excludes if t.casefold() in answer]
    if row.unused_turns is not None and row.unused_turns != expect.unused_turns:
        problems.append(
            f"scripted turns left unused: {row.unused_turns}, expected {expect.unused_turns}"
        )
    return problems


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


def build_tools(
    spec: ScenarioSpec, folder: Path, repo: Path | None = None
) -> tuple[list[Tool], list[Closer]]:
    """The scenario's tools, in the order it names them, and what must be closed after. A repo
    question gets `keel run`'s tools (the file tools, then the web tools) on `repo`."""
    if spec.fact is not None:
        names = spec.tools.names or [*FILE_TOOLS, *WEB_TOOLS]
    else:
        names = spec.tools.names or [*WEB_TOOLS, *(FILE_TOOLS if spec.files else ())]
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
        for rel, text in spec.files.items():
            target = folder / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
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
    required = set(spec.approvals.require)
    tools = [
        dataclasses.replace(pool[name], requires_approval=True) if name in required else pool[name]
        for name in names
    ]
    return tools, closers


def make_transport(scenario: Scenario, model: str | None, base: str) -> Transport:
    if model is not None:
        return resolve_model(model)
    if scenario.spec.script is None:
        raise ConfigError(
            f"scenario {scenario.name} ({scenario.source}) has no script; "
            "run it against a model with --model SPEC"
        )
    script = substitute(scenario.spec.script, base)
    return ScriptedTransport.from_dict(script, scenario.source)


class _EventCounts:
    """A listener: how often each event type occurred in the run."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.calls: list[str] = []
        """Each tool call requested, as `name {arguments}`."""

    def __call__(self, event: Event) -> None:
        self.counts[event.type] += 1
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
        tools, closers = build_tools(spec, Path(tmp), repo)

        def agent_on(model_transport: Transport) -> Agent:
            return Agent(
                model_transport,
                tools=tools,
                limits=scenario.limits,
                store=store,
                listeners=[counts],
            )

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
        approvals_requested=counts.counts[ApprovalRequested.type],
        resumes=counts.counts[RunResumed.type],
        page_hits=hits,
        unused_turns=unused,
        seconds=round(time.perf_counter() - started, 3),
        run_id=result.run_id,
        answer=result.answer,
        failure=None if result.failure is None else result.failure.to_dict(),
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
