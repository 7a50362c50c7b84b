"""Running SWE-QA questions: each one a real run with the real file tools over the repository.

The runtime is Keel's own Agent (its limits, first-call steering, synthesis turn, citation
check), or, with ``plain=True``, `keel.evals.swe_qa.plain`: the same transport and tools in a
loop without Keel's rules, the anchor that shows what the runtime adds. Without a model the
run is scripted from the reference answer (`reference_script`): it reads the files the
reference cites and answers with the reference, the scorers' ceiling and a check that the
whole path works with nothing to load.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from keel.agent import Agent
from keel.evals.swe_qa.archive import Question
from keel.evals.swe_qa.names import RepoIndex, reference_paths
from keel.evals.swe_qa.plain import Watch, plain_run
from keel.limits import Limits
from keel.messages import Usage
from keel.result import RunResult
from keel.store import RunStore
from keel.tools.files import file_tools
from keel.transports.base import Transport
from keel.transports.scripted import ScriptedTransport

__all__ = ["MAX_MODEL_CALLS", "Answered", "reference_script", "run_questions"]

MAX_MODEL_CALLS = 8
"""As `repo-questions-20` and `make run`: eight model calls, the first one a tool call."""
REFERENCE_READS = 3


@dataclass(slots=True)
class Answered:
    """One question's run: what it did and how it ended; `keel.evals.swe_qa.scores` scores it."""

    name: str
    repo: str
    model: str
    loop: str
    """"keel" (the runtime's rules) or "plain" (the anchor loop)."""
    question: str
    reference: str
    answer: str | None
    end: str
    """"answer", "synthesized: REASON", "cut off", "cancelled", "timeout" or a failure kind."""
    model_calls: int = 0
    tool_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    seconds: float = 0.0
    calls: list[str] = field(default_factory=list)
    opened: list[str] = field(default_factory=list)
    """Paths read_file returned text for, in order."""
    searched: int = 0
    evidence: dict[str, Any] | None = None
    run_id: str | None = None
    scores: dict[str, Any] = field(default_factory=dict)
    judge: dict[str, Any] | None = None

    @property
    def at_limit(self) -> bool:
        """A limit, not the model, ended the answer (a synthesis turn, the output limit, the
        timeout, a failure)."""
        return self.end != "answer"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def reference_script(question: Question, index: RepoIndex) -> ScriptedTransport:
    """The scripted baseline: read (up to three of) the files the reference cites that exist,
    then answer with the reference answer itself."""
    paths = [p for p in reference_paths(question.reference) if index.file_for(p) is not None]
    turns: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "read_file", "arguments": {"path": index.file_for(p)}}]}
        for p in paths[:REFERENCE_READS]
    ]
    if not turns:
        turns.append({"tool_calls": [{"name": "list_files", "arguments": {"path": "."}}]})
    turns.append({"text": question.reference})
    return ScriptedTransport.from_dict(
        {"turns": turns, "on_synthesis": {"text": question.reference}}, f"reference:{question.name}"
    )


def _end(result: RunResult, stuck: bool) -> str:
    if stuck:
        return "timeout"
    if result.failure is not None:
        return result.failure.kind
    if result.status != "completed":
        return result.status
    if result.cut_off:
        return "cut off"
    return f"synthesized: {result.synthesized}" if result.synthesized else "answer"


async def _keel_run(
    question: Question,
    repo: Path,
    transport: Transport,
    store: RunStore,
    timeout: float,
    limits: Limits,
) -> tuple[RunResult, bool, Watch]:
    watch = Watch()
    agent = Agent(transport, tools=file_tools(repo), limits=limits, store=store, listeners=[watch])
    handle = agent.start(question.question)
    waiter: asyncio.Future[RunResult] = asyncio.ensure_future(handle)
    done, _ = await asyncio.wait({waiter}, timeout=timeout)
    if done:
        return waiter.result(), False, watch
    handle.cancel()
    return await waiter, True, watch


async def run_questions(
    questions: Sequence[tuple[Question, Path, RepoIndex]],
    *,
    model: str | None,
    transport: Transport | None,
    store: RunStore,
    timeout: float,
    plain: bool = False,
    on_row: Callable[[Answered], None] | None = None,
) -> list[Answered]:
    """Each question once, one at a time (they share two cores). `transport`: the loaded
    model every run uses; None with no `model`: each question's scripted reference run."""
    rows: list[Answered] = []
    limits = Limits(max_model_calls=MAX_MODEL_CALLS)
    for question, repo, index in questions:
        used = transport or reference_script(question, index)
        started = time.perf_counter()
        if plain:
            result, stuck, watch = await plain_run(question, repo, used, timeout, MAX_MODEL_CALLS)
        else:
            result, stuck, watch = await _keel_run(question, repo, used, store, timeout, limits)
        usage = result.usage or Usage()
        row = Answered(
            name=question.name,
            repo=repo.name,
            model=model or "scripted:reference",
            loop="plain" if plain else "keel",
            question=question.question,
            reference=question.reference,
            answer=result.answer,
            end=_end(result, stuck),
            model_calls=result.model_calls,
            tool_calls=result.tool_calls,
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            seconds=round(time.perf_counter() - started, 2),
            calls=watch.calls,
            opened=watch.opened,
            searched=watch.searched,
            evidence=result.evidence,
            run_id=result.run_id,
        )
        rows.append(row)
        if on_row is not None:
            on_row(row)
    return rows
