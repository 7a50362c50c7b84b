"""What one run of a scenario records, and how it is judged against the scenario's expectation.

`RunRow` holds what an expectation can be checked against (the end of the run, its calls, the
events that show a rule at work, the requests each page received, the scripted turns left
unused) and the grade; `check` lists every way a run missed its expectation, each as a
sentence. Split from `keel.evals.runner`, which runs the scenarios.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from keel.evals.grading import Grade
from keel.evals.scenario import Bounds, ChildExpect, Count, Expect, Scenario
from keel.result import RunResult

__all__ = ["RunRow", "ScenarioReport", "actual_end", "check", "expected_end"]


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
    events: dict[str, int] = field(default_factory=dict)
    """How many events of each type the run had."""
    largest_request: int = 0
    """Tokens of the largest request sent, as Keel counted them."""
    approvals_requested: int = 0
    resumes: int = 0
    page_hits: dict[str, int] = field(default_factory=dict)
    unused_turns: int | None = None
    """Scripted turns left unused; None with a real model."""
    nudges: int | None = None
    """Requests that carried the nudge (docs/adr/0050); None with a real model."""
    seconds: float = 0.0
    run_id: str | None = None
    answer: str | None = None
    failure: dict[str, Any] | None = None
    grade: Grade = "wrong"
    """"right", "wrong" (it names something false or misses what is required) or "cut off"
    (a limit ended it, not the model: the output limit, a budget, the deadline, a failure)."""
    calls: list[str] = field(default_factory=list)
    """The run's tool calls, as `name {arguments}`, in order."""
    evidence: dict[str, Any] | None = None
    """The answer checked against the run's results (ADR 0053); None: not checked."""

    @property
    def quotes_all_check(self) -> bool | None:
        """Every quote and id of the answer checks; None: the answer was not checked."""
        return None if self.evidence is None else bool(self.evidence.get("passed"))

    @property
    def uncited_sentence(self) -> bool | None:
        """The answer has a factual sentence without an id; None: it was not checked."""
        if self.evidence is None:
            return None
        return int(self.evidence.get("uncited_sentences") or 0) > 0

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
        *((f"{kind} events", row.events.get(kind, 0), c) for kind, c in expect.events.items()),
        ("tokens of the largest request", row.largest_request, expect.largest_request),
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
    problems += _evidence_problems(expect, result)
    for name, want_child in expect.children.items():
        problems += _child_problems(name, want_child, result)
    if row.nudges is not None and (problem := _count_problem("nudges", row.nudges, expect.nudges)):
        problems.append(problem)
    if row.unused_turns is not None and row.unused_turns != expect.unused_turns:
        problems.append(
            f"scripted turns left unused: {row.unused_turns}, expected {expect.unused_turns}"
        )
    return problems


def _evidence_problems(expect: Expect, result: RunResult) -> list[str]:
    """How the answer's check against the record (ADR 0053) missed what the scenario wants."""
    evidence = result.evidence or {}
    problems: list[str] = []
    if expect.cited is not None:
        cited = bool(evidence.get("cited")) and bool(evidence.get("passed"))
        if cited != expect.cited:
            got = "cites checked evidence" if cited else "does not cite checked evidence"
            problems.append(f"answer {got}, expected cited = {str(expect.cited).lower()}")
    counts = (
        ("quotes checked", int(evidence.get("quotes_checked") or 0), expect.quotes_checked),
        ("quotes failed", len(evidence.get("quotes_failed") or ()), expect.quotes_failed),
        ("unknown ids", len(evidence.get("unknown_ids") or ()), expect.unknown_ids),
    )
    for what, value, bound in counts:
        if (problem := _count_problem(what, value, bound)) is not None:
            problems.append(problem)
    if expect.partial is not None and result.partial != expect.partial:
        problems.append(f"partial: {str(result.partial).lower()}, expected "
                        f"{str(expect.partial).lower()}")  # fmt: skip
    return problems


def _child_problems(name: str, want: ChildExpect, result: RunResult) -> list[str]:
    """How the run's children of agent `name` missed what the scenario expects of them."""
    mine = [c for c in result.children if c.agent == name]
    problems = []
    if want.count is not None and (problem := _count_problem(f"{name} children", len(mine),
                                                               want.count)):  # fmt: skip
        problems.append(problem)
    for child in mine:
        synthesized = child.synthesized or False
        if child.status != want.status or (
            want.synthesized is not None and synthesized != want.synthesized
        ):
            problems.append(
                f"child {child.run_id} of {name} ended {child.status} (synthesized: "
                f"{synthesized}), expected {want.status}"
                + ("" if want.synthesized is None else f" (synthesized: {want.synthesized})")
            )
    return problems
