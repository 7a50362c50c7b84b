"""Long runs (issue 44): `keel eval --suite long-runs`, measured with read-back on and off.

Each scenario of the suite reads documents whose text is many times a 4k, 8k or 32k window
(file tools over a generated folder, `fetch` over pages on loopback), has one turn refused as
too long in a provider's words at a seeded turn, and asks at its end for facts planted at its
start; its scripted model reads them back with `read_result`. The suite runs twice: as it is,
and with read-back off (`--no-read-back`), where the same model fetches again what it would
have read back (`keel.evals.long_run_figures.without_read_back`). One table per window:

- runs that end with an answer (a synthesized one counts; the goal: all);
- answers with the planted facts (each in a result the answer cites, as it was shown);
- fetches re-issued for results that had been elided;
- repeat synthesis turns caused by re-fetching an elided result (the goal: 0);
- refusals survived by a smaller request; tokens per run; the tools' results over the window.

Then the sweep (`--no-sweep` skips it): each scenario again, read-back on, its refusal moved
to every turn in turn, from the first: how many runs end with an answer wherever the refusal
comes. Scripted and on loopback, so the figures are the same on every machine; the time is
not measured.

    python benchmarks/long_runs.py [--only files_4k ...] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

try:
    import keel  # noqa: F401
except ModuleNotFoundError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from keel.evals.loading import resolve
from keel.evals.long_run_figures import (
    Figures,
    figures,
    script_calls,
    with_refusal_at,
    without_read_back,
)
from keel.evals.runner import run_once
from keel.evals.scenario import Scenario
from keel.store import RunStore, Store


async def measure(scenario: Scenario, store: RunStore) -> tuple[Figures, bool]:
    """The scenario's figures, and whether it passed its expectation."""
    row = await run_once(scenario, model=None, store=store)
    assert row.run_id is not None, row.problems
    return figures(scenario, row, store.events(row.run_id)), row.passed


def answered(end: str) -> bool:
    """An answer, or a synthesized one: the run did not end without one."""
    return end == "answer" or end.startswith("synthesized")


def table(window: int, rows: Sequence[Figures]) -> list[str]:
    lines = [
        f"**{window // 1024}k window ({window:,} tokens)**",
        "",
        "| read-back | runs | ended with an answer | answers with the planted facts "
        "| fetches re-issued for elided results | synthesis turns caused by re-fetching "
        "| refusals survived | tokens per run | results / window |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    base = None
    for on in (True, False):
        mine = [f for f in rows if f.read_back is on]
        if not mine:
            continue
        n = len(mine)
        ratios = [f.results_per_window for f in mine]
        tokens = sum(f.tokens for f in mine) / n
        base = tokens if base is None else base
        than = "" if on or not base else f" ({tokens / base - 1:+.0%})"
        lines.append(
            f"| {'on' if on else 'off'} | {n} | {sum(f.answered for f in mine)}/{n} "
            f"| {sum(f.facts for f in mine)}/{n} | {sum(f.refetched for f in mine)} "
            f"| {sum(f.refetch_synthesis for f in mine)} | {sum(f.shrinks for f in mine)} "
            f"| {round(tokens):,}{than} "
            f"| {min(ratios):.1f}x-{max(ratios):.1f}x |"
        )
    return lines


def detail(rows: Sequence[Figures]) -> list[str]:
    lines = [
        "| scenario | read-back | end | facts | re-fetched | tokens | results / window |",
        "|---|---|---|---|---|---|---|",
    ]
    for f in rows:
        lines.append(
            f"| {f.scenario} | {'on' if f.read_back else 'off'} | {f.end} "
            f"| {'yes' if f.facts else 'no'} | {f.refetched} | {f.tokens:,} "
            f"| {f.results_per_window:.1f}x |"
        )
    return lines


async def sweep(scenarios: Sequence[Scenario], store: RunStore) -> dict[str, list[str]]:
    """For each scenario, the end of a run with its refusal before each turn in turn."""
    ends: dict[str, list[str]] = {}
    for scenario in scenarios:
        turns = len(script_calls((scenario.spec.script or {}).get("turns", [])))
        ends[scenario.name] = []
        for turn in range(turns):
            row = await run_once(with_refusal_at(scenario, turn), model=None, store=store)
            ends[scenario.name].append(row.actual)
    return ends


def sweep_table(scenarios: Sequence[Scenario], ends: dict[str, list[str]]) -> list[str]:
    lines = [
        "| window | runs | ended with an answer | ContextExhausted | other ends "
        "| turns whose refusal ended the run without an answer |",
        "|---|---|---|---|---|---|",
    ]
    for window in sorted({s.limits.context_window or 0 for s in scenarios}):
        mine = [s for s in scenarios if s.limits.context_window == window]
        all_ends = [end for s in mine for end in ends[s.name]]
        done = sum(answered(e) for e in all_ends)
        exhausted = all_ends.count("ContextExhausted")
        lost = "; ".join(
            f"{s.name}: {', '.join(str(t) for t, e in enumerate(ends[s.name]) if not answered(e))}"
            for s in mine
            if not all(answered(e) for e in ends[s.name])
        )
        lines.append(
            f"| {window // 1024}k | {len(all_ends)} | {done} | {exhausted} "
            f"| {len(all_ends) - done - exhausted} | {lost or '-'} |"
        )
    return lines


async def main_async(args: argparse.Namespace) -> int:
    scenarios = resolve(args.only, "long-runs")
    measured: list[Figures] = []
    failed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="keel-long-runs-") as folder:
        store = Store(Path(folder) / "runs.sqlite")
        try:
            for scenario in scenarios:
                on, passed = await measure(scenario, store)
                off, _ = await measure(without_read_back(scenario), store)
                measured += [on, off]
                if not passed:
                    failed.append(scenario.name)
            ends = {} if args.no_sweep else await sweep(scenarios, store)
        finally:
            store.close()
    out: list[str] = []
    for window in sorted({f.window for f in measured}):
        out += [*table(window, [f for f in measured if f.window == window]), ""]
    out += ["Each run:", "", *detail(measured), ""]
    if ends:
        out += ["A refusal before each turn in turn (read-back on):", ""]
        out += [*sweep_table(scenarios, ends), ""]
    out.append(
        "the suite passed"
        if not failed
        else f"the suite FAILED (with read-back on): {', '.join(failed)}"
    )
    print("\n".join(out))
    if args.json:
        Path(args.json).write_text(
            json.dumps({"runs": [asdict(f) for f in measured], "sweep": ends}, indent=1)
        )
    return 1 if failed else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--only", nargs="*", default=[], help="scenario names (default: all)")
    parser.add_argument("--no-sweep", action="store_true", help="skip the refusal sweep")
    parser.add_argument("--json", help="also write every run's figures here")
    raise SystemExit(asyncio.run(main_async(parser.parse_args())))


if __name__ == "__main__":
    main()
