"""The replay's tables: per corpus and model, and pooled over everything replayed.

    runs | synthesis turn | hard limit | calls after synthesis | resolved cut before last
    source write | back-to-back loops caught

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
        )
    return grid


def _share(n: int, total: int) -> str:
    return f"{n} ({n / total:.0%})" if total else "0"
