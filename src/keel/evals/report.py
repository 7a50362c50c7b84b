"""The evaluation's output: one table row per scenario for people, one JSON object for tools.

With repeats, a row sums up every run of its scenario: how often the runs ended each way (an
answer, a synthesized answer, each failure kind), the range of calls, and how many passed. The
JSON keeps every run, with its problems, for whoever wants to look closer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from keel.evals.grading import GRADES
from keel.evals.judging import RunRow, ScenarioReport

__all__ = [
    "WIDE",
    "citation_line",
    "citation_shares",
    "print_grades",
    "print_table",
    "to_json",
]

WIDE = 160
"""Columns for the table when stdout is not a terminal (a log, a pipe): no wrapping."""


def to_json(reports: Sequence[ScenarioReport], *, model: str | None, repeat: int) -> dict[str, Any]:
    return {
        "passed": all(r.passed for r in reports),
        "model": model,
        "repeat": repeat,
        "evidence": citation_shares([row for r in reports for row in r.rows]),
        "scenarios": [
            {
                "name": r.scenario.name,
                "source": r.scenario.source,
                "description": r.scenario.spec.description,
                "expected": r.rows[0].expected if r.rows else None,
                "passed": r.passed,
                "runs": len(r.rows),
                "passes": sum(row.passed for row in r.rows),
                "grades": {g: sum(row.grade == g for row in r.rows) for g in GRADES},
                "outcomes": dict(r.outcomes.most_common()),
                "results": [
                    row.to_dict()
                    | {
                        "quotes_all_check": row.quotes_all_check,
                        "uncited_sentence": row.uncited_sentence,
                    }
                    for row in r.rows
                ],
            }
            for r in reports
        ],
    }


def print_table(reports: Sequence[ScenarioReport], console: Console) -> None:
    table = Table(
        "scenario",
        "expected end",
        "actual end",
        "model calls",
        "tool calls",
        "synthesized",
        "cost",
        "result",
        "time",
        title_justify="left",
    )
    for report in reports:
        table.add_row(*_cells(report))
    console.print(table)
    problems = [row for report in reports for row in report.rows if not row.passed]
    for row in problems:
        where = (
            row.scenario
            if len(_rows_of(reports, row.scenario)) == 1
            else (f"{row.scenario} #{row.repeat}")
        )
        for problem in row.problems:
            console.print(f"  {where}: {problem}", highlight=False, markup=False)
    line = citation_line([row for r in reports for row in r.rows])
    if line is not None:
        console.print(line, highlight=False, markup=False)
    passed = sum(r.passed for r in reports)
    verdict = "[green]all passed[/green]" if passed == len(reports) else "[red]FAILED[/red]"
    console.print(f"{passed} of {len(reports)} scenarios passed: {verdict}")


def print_grades(reports: Sequence[ScenarioReport], console: Console) -> None:
    """How many runs of each question were right, wrong and cut off, and how many of them were
    answered in a synthesis turn."""
    table = Table(
        "question",
        *GRADES,
        "runs",
        "synthesized",
        "quotes all check",
        "uncited sentence",
        title="answers",
        title_justify="left",
    )
    for report in reports:
        counts = [sum(row.grade == g for row in report.rows) for g in GRADES]
        synthesized = sum(1 for row in report.rows if row.synthesized)
        table.add_row(
            report.scenario.name,
            *map(str, counts),
            str(len(report.rows)),
            str(synthesized),
            *_citation_cells(report.rows),
        )
    rows = [row for r in reports for row in r.rows]
    total = [sum(row.grade == g for row in rows) for g in GRADES]
    synthesized = sum(1 for row in rows if row.synthesized)
    table.add_row(
        "all",
        *map(str, total),
        str(len(rows)),
        str(synthesized),
        *_citation_cells(rows),
        style="bold",
    )
    console.print(table)


def citation_shares(rows: Sequence[RunRow]) -> dict[str, Any]:
    """Of the answers checked against the record (ADR 0053): how many had every quote and id
    check, and how many had a factual sentence without an id."""
    checked = [row for row in rows if row.evidence is not None]
    return {
        "answers_checked": len(checked),
        "quotes_all_check": sum(1 for row in checked if row.quotes_all_check),
        "uncited_sentence": sum(1 for row in checked if row.uncited_sentence),
    }


def citation_line(rows: Sequence[RunRow]) -> str | None:
    shares = citation_shares(rows)
    n = shares["answers_checked"]
    if not n:
        return None
    return (
        f"evidence: every quote and id checked in {shares['quotes_all_check']} of {n} answers "
        f"({shares['quotes_all_check'] / n:.0%}); an uncited factual sentence in "
        f"{shares['uncited_sentence']} of {n} ({shares['uncited_sentence'] / n:.0%})"
    )


def _citation_cells(rows: Sequence[RunRow]) -> tuple[str, str]:
    shares = citation_shares(rows)
    n = shares["answers_checked"]
    if not n:
        return "-", "-"
    return f"{shares['quotes_all_check']}/{n}", f"{shares['uncited_sentence']}/{n}"


def _rows_of(reports: Sequence[ScenarioReport], name: str) -> list[RunRow]:
    return [row for r in reports if r.scenario.name == name for row in r.rows]


def _cells(report: ScenarioReport) -> tuple[str, ...]:
    rows = report.rows
    if len(rows) == 1:
        (row,) = rows
        actual = row.actual
        synthesized = row.synthesized or "no"
        result = "[green]pass[/green]" if row.passed else "[red]FAIL[/red]"
    else:
        actual = ", ".join(f"{end}: {n}" for end, n in report.outcomes.most_common())
        synthesized = f"{sum(1 for r in rows if r.synthesized)}/{len(rows)}"
        passes = sum(r.passed for r in rows)
        colour = "green" if passes == len(rows) else "red"
        word = "pass" if passes == len(rows) else "FAIL"
        result = f"[{colour}]{word} {passes}/{len(rows)}[/{colour}]"
    return (
        report.scenario.name,
        rows[0].expected if rows else "",
        actual,
        _span([r.model_calls for r in rows]),
        _span([r.tool_calls for r in rows]),
        synthesized,
        _cost([r.cost for r in rows]),
        result,
        f"{sum(r.seconds for r in rows):.2f}s",
    )


def _cost(values: list[float | None]) -> str:
    """The scenario's cost over its runs; "unknown" when some model had no known price."""
    if any(v is None for v in values):
        return "unknown"
    return f"${sum(v for v in values if v is not None):.4f}"


def _span(values: list[int]) -> str:
    if not values:
        return ""
    low, high = min(values), max(values)
    return str(low) if low == high else f"{low}-{high}"
