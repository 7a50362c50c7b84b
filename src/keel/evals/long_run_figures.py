"""What `keel eval --suite long-runs` measures beyond pass or fail (issue 44, ADR 0060).

A long-run scenario passes when its run ends with an answer holding the facts planted at its
start. The benchmark (benchmarks/long_runs.py) asks more of each run, read from its events:
whether the answer's facts were in a result the answer cites, as that result was shown; how
many calls fetched again a result the context builder had elided; whether a repeat synthesis
came of such a call; the tokens the run sent and received; how large its tools' results were
beside the window. And it runs the suite a second time with read-back off (`--no-read-back`):

- `without_read_back(scenario)`: `Limits.read_back` off, and the script rewritten as a model
  would then act: each ``read_result(id="rN")`` becomes the call that produced ``rN`` (the
  N-th tool call of the script), made again. The result ids of the run stay as they were, so
  the answer's citations name the fetch that replaced the read.
- `with_refusal_at(scenario, turn)`: its one refusal before `turn` instead of the seeded turn
  (what the benchmark's sweep of every turn runs).

Pure but for `figures`, which reads a finished run's events from its store.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from keel.evals.judging import RunRow
from keel.evals.refusals import refusal
from keel.evals.scenario import Scenario
from keel.records import (
    ContextShrunk,
    Event,
    ModelResponseReceived,
    ResultElided,
    ToolCallRequested,
    ToolResultRecorded,
)
from keel.tokens import EstimatingCounter
from keel.tools.read_back import READ_BACK_NAME

__all__ = ["Figures", "figures", "script_calls", "with_refusal_at", "without_read_back"]

_CITED = re.compile(r"\[\s*(r\d+(?:\s*[,;]\s*r\d+)*)\s*\]")
BYTES_PER_TOKEN = EstimatingCounter().bytes_per_token
"""How results are put beside the window: the context builder's own estimate."""


@dataclass(frozen=True, slots=True)
class Figures:
    """One run of a long-run scenario, measured."""

    scenario: str
    window: int
    """The scenario's `context_window`, in tokens."""
    read_back: bool
    answered: bool
    """Completed with an answer (a synthesized one too)."""
    end: str
    """As the evaluation's table says it: "answer", "synthesized: context", a failure kind."""
    facts: bool
    """Every planted fact (the scenario's `answer_contains`) is in the answer and in a result
    the answer cites, as that result was shown to the model."""
    refetched: int
    """Tool calls (not read_result) whose call had had its result elided before they were
    made: fetches re-issued for elided results."""
    refetch_synthesis: bool
    """The run ended in a repeat synthesis on the call it had re-issued for an elided result."""
    tokens: int
    """Input and output tokens of the run's model calls (a scripted call's input is Keel's
    count of its request)."""
    results: int
    """Characters of the tools' results, each whole (before the result cap), read_result's
    own not counted."""
    shrinks: int
    """Refusals as too long that the run survived with a smaller request (`context_shrunk`)."""

    @property
    def results_per_window(self) -> float:
        """The tools' results over the window, in the context builder's estimate of tokens."""
        return self.results / BYTES_PER_TOKEN / self.window


def figures(scenario: Scenario, row: RunRow, events: Sequence[Event]) -> Figures:
    """The figures of one finished run: its evaluation row and its events."""
    calls = [e for e in events if isinstance(e, ToolCallRequested)]
    results = {e.call_id: e for e in events if isinstance(e, ToolResultRecorded)}
    shown = {
        f"r{n}": results[c.call_id].content for n, c in enumerate(calls, 1) if c.call_id in results
    }
    answer = row.answer or ""
    cited = [ref.strip() for group in _CITED.findall(answer) for ref in re.split(r"[,;]", group)]
    wanted = scenario.spec.expect.answer_contains
    facts = bool(wanted) and all(
        fact.casefold() in answer.casefold()
        and any(fact.casefold() in shown.get(ref, "").casefold() for ref in cited)
        for fact in wanted
    )
    elided: set[str] = set()
    again: Counter[str] = Counter()
    for event in events:
        if isinstance(event, ResultElided):
            elided.add(event.call_key)
        elif (
            isinstance(event, ToolCallRequested)
            and event.name != READ_BACK_NAME
            and event.call_key in elided
        ):
            again[event.call_key] += 1
    made = Counter(c.call_key for c in calls if c.name != READ_BACK_NAME)
    most = made.most_common(1)[0][0] if made else None
    tokens = sum(
        e.usage.input_tokens + e.usage.output_tokens
        for e in events
        if isinstance(e, ModelResponseReceived)
    )
    return Figures(
        scenario=scenario.name,
        window=scenario.limits.context_window or 0,
        read_back=scenario.limits.read_back,
        answered=row.actual == "answer" or row.actual.startswith("synthesized"),
        end=row.actual,
        facts=facts,
        refetched=sum(again.values()),
        refetch_synthesis=row.synthesized == "repeated_tool" and most in again,
        tokens=tokens,
        results=sum(e.size for e in results.values() if e.name != READ_BACK_NAME),
        shrinks=sum(isinstance(e, ContextShrunk) for e in events),
    )


def script_calls(turns: Sequence[Any]) -> list[dict[str, Any]]:
    """The script's turns with every ``repeat`` written out, in order."""
    out: list[dict[str, Any]] = []
    for turn in turns:
        if isinstance(turn, dict) and "repeat" in turn:
            for _ in range(int(turn["repeat"])):
                out += script_calls([turn["turn"]])
        else:
            out.append(turn)
    return out


def without_read_back(scenario: Scenario) -> Scenario:
    """The scenario with read-back off, its scripted model fetching again what it would have
    read back: each read_result call becomes the call that produced the result it names."""
    script = scenario.spec.script or {}
    produced: list[dict[str, Any]] = []  # by result number: the call that made it
    turns = []
    for turn in script_calls(script.get("turns", [])):
        if isinstance(turn, dict) and "tool_calls" in turn:
            made = [_original(call, produced) for call in turn["tool_calls"]]
            produced += made
            turn = {**turn, "tool_calls": made}
        turns.append(turn)
    spec = scenario.spec.model_copy(update={"script": {**script, "turns": turns}})
    limits = dataclasses.replace(scenario.limits, read_back=False)
    return dataclasses.replace(scenario, spec=spec, limits=limits)


def _original(call: dict[str, Any], produced: list[dict[str, Any]]) -> dict[str, Any]:
    """The call that produced the result a read_result call names (itself, for any other)."""
    arguments = call.get("arguments")
    if call.get("name") != READ_BACK_NAME or not isinstance(arguments, dict):
        return call
    ref = str(arguments.get("id", "")).strip().strip("[]")
    number = int(ref[1:]) if re.fullmatch(r"r\d+", ref) else 0
    if not 1 <= number <= len(produced):
        return call
    return produced[number - 1]


def with_refusal_at(scenario: Scenario, turn: int) -> Scenario:
    """The scenario with its first refusal's wording before script turn `turn` (0-based), and
    no other: the benchmark moves one refusal through every turn of a run."""
    refusals = scenario.spec.refusals
    window = scenario.limits.context_window
    if refusals is None or window is None or scenario.spec.script is None:
        raise ValueError(f"{scenario.name} has no refusals to move")
    turns = script_calls(scenario.spec.script.get("turns", []))
    turns.insert(turn, refusal(refusals.wordings[0], window))
    script = {**scenario.spec.script, "turns": turns}
    spec = scenario.spec.model_copy(update={"script": script, "refusals": None})
    return dataclasses.replace(scenario, spec=spec)
