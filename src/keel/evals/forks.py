"""`keel eval --fork RUN --at STEP --model A --model B --repeat N`: one stored run forked at one
step under several models, on the identical prefix, and one table of how each did (ADR 0051).

The prefix is derived once (`keel._run.fork.prefix_of_run`); each fork is a run of its own in
the same store, built as the original was (its tools, limits, system text and approvals,
`assemble.agent_for_record`'s way) with the model replaced, so only the model differs. The
table counts what the forks did after the branch point (the prefix is the same for all and
cost nothing): how each ended, whether it was synthesized, its answer, its calls, tokens and
cost, and how each model differs from the first (the baseline).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

from rich.console import Console
from rich.table import Table

from keel.records import JsonObject
from keel.result import RunResult
from keel.store import RunStore

__all__ = ["ForkRun", "compare", "print_comparison", "to_json"]


@dataclass(frozen=True, slots=True)
class ForkRun:
    """One fork's run, counted from the branch point on."""

    model: str
    run_id: str
    status: str
    answer: str | None
    synthesized: str | None
    failure: str | None
    model_calls: int
    tool_calls: int
    input_tokens: int
    output_tokens: int
    cost: float | None

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "run_id": self.run_id,
            "status": self.status,
            "answer": self.answer,
            "synthesized": self.synthesized,
            "failure": self.failure,
            "model_calls": self.model_calls,
            "tool_calls": self.tool_calls,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cost_usd": self.cost,
        }


@dataclass(frozen=True, slots=True)
class Comparison:
    origin: JsonObject
    prefix_model_calls: int
    prefix_tool_calls: int
    models: tuple[str, ...]
    runs: tuple[ForkRun, ...]

    def of(self, model: str) -> list[ForkRun]:
        return [r for r in self.runs if r.model == model]


async def compare(
    store: RunStore, run_id: str, at: int, models: list[str], repeat: int
) -> Comparison:
    """Fork `run_id` at `at` `repeat` times under each of `models`, one after another."""
    from keel._run import Forked, prefix_of_run
    from keel.assemble import agent_for_record
    from keel.errors import ConfigError

    record = store.get_run(run_id)
    if record is None:
        raise ConfigError(f"no run {run_id} in {store.path}")
    prefix = prefix_of_run(store, run_id, at)
    runs = []
    for model in models:
        for _ in range(repeat):
            stored = replace(record, config=replace(record.config, model=model))
            agent = agent_for_record(stored, store)
            result = await agent.launch(Forked(prefix))
            runs.append(_row(model, result, prefix.state.model_calls, prefix.state.tool_calls,
                             prefix.state.usage.input_tokens, prefix.state.usage.output_tokens,
                             prefix.state.cost))  # fmt: skip
    return Comparison(
        prefix.origin,
        prefix.state.model_calls,
        prefix.state.tool_calls,
        tuple(models),
        tuple(runs),
    )


def _row(
    model: str,
    result: RunResult,
    model_calls: int,
    tool_calls: int,
    input_tokens: int,
    output_tokens: int,
    cost: float | None,
) -> ForkRun:
    spent = None
    if result.cost is not None:
        spent = round(result.cost - (cost or 0.0), 10)
    return ForkRun(
        model=model,
        run_id=result.run_id,
        status=result.status,
        answer=result.answer,
        synthesized=result.synthesized,
        failure=result.failure.kind if result.failure else None,
        model_calls=result.model_calls - model_calls,
        tool_calls=result.tool_calls - tool_calls,
        input_tokens=result.usage.input_tokens - input_tokens,
        output_tokens=result.usage.output_tokens - output_tokens,
        cost=spent,
    )


def _summary(runs: list[ForkRun]) -> dict[str, Any]:
    n = len(runs) or 1
    answers = Counter(r.answer for r in runs)
    costs = [r.cost for r in runs]
    return {
        "runs": len(runs),
        "status": dict(Counter(r.failure or r.status for r in runs)),
        "synthesized": dict(Counter(r.synthesized for r in runs if r.synthesized)),
        "answer": answers.most_common(1)[0][0] if runs else None,
        "distinct_answers": len(answers),
        "model_calls": sum(r.model_calls for r in runs) / n,
        "tool_calls": sum(r.tool_calls for r in runs) / n,
        "tokens": sum(r.input_tokens + r.output_tokens for r in runs) / n,
        "cost_usd": None if any(c is None for c in costs) else sum(c or 0.0 for c in costs) / n,
    }


def _diff(summary: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    cost = None
    if summary["cost_usd"] is not None and base["cost_usd"] is not None:
        cost = round(summary["cost_usd"] - base["cost_usd"], 10)
    return {
        "same_answer": summary["answer"] == base["answer"],
        "same_status": summary["status"] == base["status"],
        "same_synthesized": summary["synthesized"] == base["synthesized"],
        "model_calls": summary["model_calls"] - base["model_calls"],
        "tool_calls": summary["tool_calls"] - base["tool_calls"],
        "tokens": summary["tokens"] - base["tokens"],
        "cost_usd": cost,
    }


def to_json(comparison: Comparison) -> dict[str, Any]:
    """The table as one JSON object: the branch point, the prefix, and per model its runs, its
    summary and its difference from the baseline (the first model)."""
    summaries = {m: _summary(comparison.of(m)) for m in comparison.models}
    base = summaries[comparison.models[0]]
    return {
        "forked_from": comparison.origin,
        "prefix": {
            "model_calls": comparison.prefix_model_calls,
            "tool_calls": comparison.prefix_tool_calls,
        },
        "baseline": comparison.models[0],
        "models": [
            {
                "model": m,
                "summary": summaries[m],
                "vs_baseline": None if n == 0 else _diff(summaries[m], base),
                "runs": [r.to_json() for r in comparison.of(m)],
            }
            for n, m in enumerate(comparison.models)
        ],
    }


def print_comparison(comparison: Comparison, out: Console) -> None:
    shown = to_json(comparison)
    origin = comparison.origin
    table = Table(
        title=f"fork of run {origin.get('run_id')} at step {origin.get('step')} "
        f"(prefix: {comparison.prefix_model_calls} model calls, "
        f"{comparison.prefix_tool_calls} tool calls, copied); counted after the branch point",
    )
    for column in ("model", "runs", "status", "synthesized", "answer", "calls", "tokens", "cost",
                   "vs baseline"):  # fmt: skip
        table.add_column(column)
    for entry in shown["models"]:
        s = entry["summary"]
        answer = s["answer"] or ""
        if len(answer) > 60:
            answer = answer[:57] + "..."
        if s["distinct_answers"] > 1:
            answer += f" ({s['distinct_answers']} distinct)"
        table.add_row(
            entry["model"],
            str(s["runs"]),
            _counts(s["status"]),
            _counts(s["synthesized"]) or "-",
            answer,
            f"{_number(s['model_calls'])} model, {_number(s['tool_calls'])} tool",
            _number(s["tokens"]),
            "unknown" if s["cost_usd"] is None else f"${s['cost_usd']:.4f}",
            "baseline" if entry["vs_baseline"] is None else _diff_text(entry["vs_baseline"]),
        )
    out.print(table)


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} x{v}" for k, v in counts.items())


def _number(value: float) -> str:
    return f"{value:g}" if value == int(value) else f"{value:.1f}"


def _signed(value: float) -> str:
    return f"{'+' if value > 0 else ''}{_number(value)}"


def _diff_text(diff: dict[str, Any]) -> str:
    parts = ["same answer" if diff["same_answer"] else "answer differs"]
    if not diff["same_status"]:
        parts.append("status differs")
    if not diff["same_synthesized"]:
        parts.append("synthesis differs")
    parts.append(f"calls {_signed(diff['model_calls'])}/{_signed(diff['tool_calls'])}")
    parts.append(f"tokens {_signed(diff['tokens'])}")
    if diff["cost_usd"] is not None:
        parts.append(f"cost {'+' if diff['cost_usd'] >= 0 else '-'}${abs(diff['cost_usd']):.4f}")
    return "; ".join(parts)
