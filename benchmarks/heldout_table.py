"""Replay a held-out set once per tier set and print the table docs/loop-rules.md asks for.

For each of `--tiers none`, `policy`, `same_result`, `alternation` and `same_result,alternation`
this runs `keel replay FILES --format FORMAT --json --tiers T` (the defaults otherwise: T = 5,
policy `progress`, effects by kind) and counts, over all runs:

- runs triggered (a synthesis turn came) and by what (`identical` or a tier);
- each loop definition's loops in unresolved runs, and how many the synthesis turn reached by
  the loop's end (resolved runs' loops are not loops to catch: they are listed apart);
- back-to-back loops (four identical turns in a row) caught;
- resolved runs cut: with a synthesis turn before their last call (`calls_after_synthesis >
  0`), the measure ADR 0064 fixed for sets whose tools write no source file; and before their
  last source write, where the recordings mark one.

Usage: PYTHONPATH=src python benchmarks/heldout_table.py --format nemo-gym FILE...
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import Counter
from typing import Any

TIER_SETS = ("none", "policy", "same_result", "alternation", "same_result,alternation")


def replay(files: list[str], fmt: str, tiers: str) -> list[dict[str, Any]]:
    command = [sys.executable, "-m", "keel", "replay", *files, "--json", "--tiers", tiers]
    command += ["--format", fmt]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def tally(runs: list[dict[str, Any]]) -> dict[str, Any]:
    triggered = Counter(r["tier"] or "?" for r in runs if r["synthesis_after"] is not None)
    loops: dict[str, list[int]] = {}
    for run in runs:
        for name, end in run["loops"].items():
            counts = loops.setdefault(name, [0, 0, 0, 0])
            at = 2 if run["resolved"] else 0
            counts[at] += 1
            after = run["synthesis_after"]
            counts[at + 1] += after is not None and after <= end
    resolved = [r for r in runs if r["resolved"] is True]
    return {
        "runs": len(runs),
        "triggered": sum(triggered.values()),
        "by": dict(sorted(triggered.items())),
        "loops": loops,
        "back_to_back": (
            sum(r["back_to_back_loop"] for r in runs),
            sum(r["back_to_back_loop"] and r["synthesis_after"] is not None for r in runs),
        ),
        "resolved": len(resolved),
        "cut_before_last_call": sorted(
            f"{r['model']} {r['id']}" for r in resolved if r["calls_after_synthesis"]
        ),
        "writes_known": any(r["last_source_write"] is not None for r in runs),
        "cut_before_last_write": sum(r["cut_before_last_write"] for r in resolved),
    }


def row(tiers: str, t: dict[str, Any], base: int) -> str:
    by = ", ".join(f"{k} {v}" for k, v in t["by"].items()) or "-"
    loops = "; ".join(
        f"{name} {c[1]} of {c[0]} (resolved runs' {c[2]}, reached {c[3]})"
        for name, c in sorted(t["loops"].items())
    )
    cut = len(t["cut_before_last_call"])
    write = f"{t['cut_before_last_write']}" if t["writes_known"] else "-"
    return (
        f"| {tiers} | {t['runs']} | {t['triggered']} | {by} | {loops or '-'} | "
        f"{t['back_to_back'][1]} of {t['back_to_back'][0]} | {cut} of {t['resolved']} "
        f"({100 * cut / max(t['resolved'], 1):.1f}%, {cut - base:+d} on none) | {write} |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--format", default="auto")
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()
    tallies = {tiers: tally(replay(args.files, args.format, tiers)) for tiers in TIER_SETS}
    base = len(tallies["none"]["cut_before_last_call"])
    print(
        "| tiers | runs | runs triggered | triggered by | loops caught (unresolved runs) | "
        "back-to-back loops caught | resolved cut before last call | before last write |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for tiers, t in tallies.items():
        print(row(tiers, t, base))
    for tiers, t in tallies.items():
        print(f"{tiers}: resolved runs cut before their last call: {t['cut_before_last_call']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
