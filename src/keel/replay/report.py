"""The replay's tables: per corpus and model, and pooled over everything replayed.

    runs | synthesis turn | hard limit | calls after synthesis | resolved cut before last
    source write | back-to-back loops caught | triggered by | loops caught by the end of the
    loop, per tier's definition (in unresolved runs; in resolved runs)

A cell that the recordings cannot fill (no `resolved`, no `source_write`) says so with a dash.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from rich.table import Table

from keel.replay.playback import Replayed

__all__ = ["Row", "rows", "table"]


@dataclass(slots=True)
class Row:
    name: str
    runs: int = 0
    synthesis: int = 0
    hard_limit: int = 0
    calls_after_synthesis: int = 0
    resolved: int = 0
    resolved_cut: int = 0
    writes_known: bool = False
    loops: int = 0
    loops_caught: int = 0
    keys: dict[str, int] = field(default_factory=dict)
    nudged: int = 0
    """Runs that would have had the nudge (with `--nudge`)."""
    resolved_nudged: int = 0
    """Resolved runs that would have had it before their last source write."""
    triggered: dict[str, int] = field(default_factory=dict)
    """Runs whose synthesis turn each rule brought: `identical` or a tier's name."""
    tier_loops: dict[str, list[int]] = field(default_factory=dict)
    """Per loop definition: [loops in unresolved runs, caught, loops in resolved runs,
    caught], caught meaning the synthesis turn came by the end of the loop."""

    def add(self, replayed: Replayed) -> None:
        self.runs += 1
        self.synthesis += replayed.synthesis_after is not None
        self.hard_limit += replayed.hard_limit_at is not None
        self.calls_after_synthesis += replayed.calls_after_synthesis
        if replayed.recording.resolved:
            self.resolved += 1
            self.resolved_cut += replayed.cut_before_last_write
        self.writes_known |= replayed.last_source_write is not None
        if replayed.back_to_back_loop:
            self.loops += 1
            self.loops_caught += replayed.synthesis_after is not None
        if replayed.nudge_after is not None:
            self.nudged += 1
            last = replayed.last_source_write
            if replayed.recording.resolved and last is not None and replayed.nudge_after < last:
                self.resolved_nudged += 1
        if replayed.tier is not None:
            self.triggered[replayed.tier] = self.triggered.get(replayed.tier, 0) + 1
        for name, _ in replayed.loops:
            counts = self.tier_loops.setdefault(name, [0, 0, 0, 0])
            at = 2 if replayed.recording.resolved else 0
            counts[at] += 1
            counts[at + 1] += bool(replayed.caught(name))

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "runs": self.runs,
            "synthesis": self.synthesis,
            "hard_limit": self.hard_limit,
            "calls_after_synthesis": self.calls_after_synthesis,
            "resolved": self.resolved,
            "resolved_cut_before_last_write": self.resolved_cut if self.writes_known else None,
            "back_to_back_loops": self.loops,
            "back_to_back_loops_caught": self.loops_caught,
            "triggered_by": dict(sorted(self.triggered.items())),
            "nudged": self.nudged,
            "resolved_nudged_before_last_write": self.resolved_nudged,
            "loops": {
                name: {
                    "unresolved": c[0],
                    "unresolved_caught": c[1],
                    "resolved": c[2],
                    "resolved_caught": c[3],
                }
                for name, c in sorted(self.tier_loops.items())
            },
        }


def rows(replayed: Iterable[Replayed]) -> list[Row]:
    """One row per corpus and model, in the order first seen, then the pooled row."""
    groups: dict[str, Row] = {}
    pooled = Row("all")
    for item in replayed:
        r = item.recording
        name = " / ".join(part for part in (r.corpus, r.model) if part) or "recordings"
        groups.setdefault(name, Row(name)).add(item)
        pooled.add(item)
    if len(groups) == 1:  # the pooled row would repeat the only one
        return list(groups.values())
    return [*groups.values(), pooled]


def table(found: list[Row], title: str) -> Table:
    grid = Table(title=title, title_justify="left")
    for header in (
        "corpus / model",
        "runs",
        "synthesis turn",
        "hard limit",
        "calls after synthesis",
        "resolved cut before last write",
        "back-to-back loops caught",
        "triggered by",
        "loops caught (unresolved; resolved)",
    ):
        grid.add_column(header, justify="left" if header == "corpus / model" else "right")
    for row in found:
        cut = f"{row.resolved_cut} of {row.resolved}" if row.resolved and row.writes_known else "-"
        grid.add_row(
            row.name,
            str(row.runs),
            _share(row.synthesis, row.runs),
            _share(row.hard_limit, row.runs),
            str(row.calls_after_synthesis),
            cut,
            f"{row.loops_caught} of {row.loops}" if row.loops else "-",
            ", ".join(f"{k} {v}" for k, v in sorted(row.triggered.items())) or "-",
            _loops(row.tier_loops),
        )
    return grid


_LOOP_ORDER = ("identical", "same_result", "alternation", "same_error")


def _loops(found: dict[str, list[int]]) -> str:
    parts = []
    for name in _LOOP_ORDER:
        if name in found:
            c = found[name]
            parts.append(f"{name} {c[1]}/{c[0]}; {c[3]}/{c[2]}")
    return ", ".join(parts) or "-"


def _share(n: int, total: int) -> str:
    return f"{n} ({n / total:.0%})" if total else "0"
