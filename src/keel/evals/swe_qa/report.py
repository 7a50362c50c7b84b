"""SWE-QA figures: one table row per repository and model (and loop), one JSON object for tools.

A share is over the answers a score applies to (`keel.evals.swe_qa.scores`), shown with that
count (``0.42 (31)``), so a reader sees how many answers stand behind it.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from keel.evals.swe_qa.running import Answered

__all__ = ["print_rows", "summaries", "to_json"]

_GROUP = ("repo", "model", "loop")


def _mean(values: list[float]) -> tuple[float | None, int]:
    return (round(statistics.fmean(values), 3) if values else None), len(values)


def summary(rows: Sequence[Answered]) -> dict[str, Any]:
    """The figures of a group of answers: means of each score, calls, tokens, seconds."""

    def scores(key: str) -> list[float]:
        return [float(r.scores[key]) for r in rows if r.scores.get(key) is not None]

    seconds = [r.seconds for r in rows]
    judged = [r.judge["mean"] for r in rows if r.judge and r.judge.get("mean") is not None]
    return {
        "questions": len(rows),
        **{
            key: dict(zip(("mean", "of"), _mean(scores(key)), strict=True))
            for key in ("reference_named", "invented", "opened_cited", "citations_pass")
        },
        "judge_mean": dict(zip(("mean", "of"), _mean(judged), strict=True)),
        "answers_at_limits": sum(r.at_limit for r in rows),
        "no_answer": sum(not (r.answer or "").strip() for r in rows),
        "ends": {end: sum(r.end == end for r in rows) for end in sorted({r.end for r in rows})},
        "model_calls": _spread([r.model_calls for r in rows]),
        "tool_calls": _spread([r.tool_calls for r in rows]),
        "read_file_calls": _spread([len(r.opened) for r in rows]),
        "tokens": _spread([r.input_tokens + r.output_tokens for r in rows]),
        "seconds": _spread(seconds),
        "total_seconds": round(sum(seconds), 1),
    }


def _spread(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"median": None, "min": None, "max": None}
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summaries(rows: Sequence[Answered]) -> list[dict[str, Any]]:
    groups: dict[tuple[str, ...], list[Answered]] = {}
    for row in rows:
        groups.setdefault(tuple(getattr(row, k) for k in _GROUP), []).append(row)
    return [dict(zip(_GROUP, key, strict=True)) | summary(group) for key, group in groups.items()]


def to_json(rows: Sequence[Answered], judge: str | None = None) -> dict[str, Any]:
    return {
        "suite": "swe-qa",
        "judge": judge,
        "tables": summaries(rows),
        "answers": [r.to_dict() for r in rows],
    }


def _share(figure: dict[str, Any]) -> str:
    return "-" if figure["mean"] is None else f"{figure['mean']:.2f} ({figure['of']})"


def _range(figure: dict[str, Any], digits: int = 0) -> str:
    if figure["median"] is None:
        return "-"
    return f"{figure['median']:.{digits}f} ({figure['min']:.{digits}f}-{figure['max']:.{digits}f})"


def print_rows(rows: Sequence[Answered], out: Console) -> None:
    table = Table(title="SWE-QA: scores from the code (share of the answers each applies to)")
    for column in (
        "repository", "model", "loop", "n", "ref. names named", "invented", "opened cited",
        "citations pass", "judge", "at limits", "model calls", "tokens", "seconds",
    ):  # fmt: skip
        table.add_column(column)
    for s in summaries(rows):
        table.add_row(
            s["repo"], s["model"], s["loop"], str(s["questions"]),
            _share(s["reference_named"]), _share(s["invented"]), _share(s["opened_cited"]),
            _share(s["citations_pass"]), _share(s["judge_mean"]), str(s["answers_at_limits"]),
            _range(s["model_calls"]), _range(s["tokens"]), _range(s["seconds"], 1),
        )  # fmt: skip
    out.print(table)
    out.print(
        "median (range) per question; ref. names named: of the reference answer's code names "
        "that exist in the repository, the share the answer names; invented: of the answer's "
        "code names, the share the repository does not hold.",
        highlight=False,
        markup=False,
    )
