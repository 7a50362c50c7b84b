"""The replay's tables: per corpus and model, and pooled over everything replayed.

    runs | synthesis turn | hard limit | calls after synthesis | resolved cut before last
    source write | back-to-back loops caught | triggered by | loops caught by the end of the
    loop, per tier's definition (in unresolved runs; in resolved runs)

A cell that the recordings cannot fill (no `resolved`, no `source_write`) says so with a dash.

With `--window`, a second table (`window_rows`, `window_table`): per corpus and model, the runs
whose requests would have passed the window with nothing elided, and with Keel's elision, the
median turn where, and the largest request.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from rich.table import Table
from rich.text import Text

from keel.present.terminal import safe_text
from keel.replay.playback import Replayed
from keel.replay.recorded import Recording
from keel.replay.window import Fit, WindowCheck

__all__ = ["Row", "WindowRow", "rows", "table", "window_rows", "window_table"]


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
        name = _group(item.recording)
        groups.setdefault(name, Row(name)).add(item)
        pooled.add(item)
    if len(groups) == 1:  # the pooled row would repeat the only one
        return list(groups.values())
    return [*groups.values(), pooled]


def _group(r: Recording) -> str:
    """A row's name: the recording's own corpus and model names, made inert (ADR 0064)."""
    return safe_text(" / ".join(part for part in (r.corpus, r.model) if part) or "recordings")


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
            Text(row.name),  # never read as markup
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


@dataclass(slots=True)
class WindowRow:
    """Where the runs of one corpus and model would have passed the window."""

    name: str
    runs: int = 0
    over: list[int] = field(default_factory=list)
    """The turn each run's request would not have fit at, with nothing elided."""
    kept_over: list[int] = field(default_factory=list)
    """The same, under Keel's context builder."""
    batch_too_big: int = 0
    """Runs whose newest batch alone would not have fit, where the builder's request did not."""
    largest: int = 0
    largest_kept: int = 0
    unsized: int = 0

    def add(self, found: Fit) -> None:
        self.runs += 1
        if found.over_at is not None:
            self.over.append(found.over_at)
        if found.kept_over_at is not None:
            self.kept_over.append(found.kept_over_at)
        self.batch_too_big += found.batch_too_big
        self.largest = max(self.largest, found.largest)
        self.largest_kept = max(self.largest_kept, found.largest_kept)
        self.unsized += found.unsized

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "runs": self.runs,
            "over": len(self.over),
            "over_median_turn": _median(self.over),
            "kept_over": len(self.kept_over),
            "kept_over_median_turn": _median(self.kept_over),
            "newest_batch_too_big": self.batch_too_big,
            "largest": self.largest,
            "largest_kept": self.largest_kept,
            "unsized_results": self.unsized,
        }


def window_rows(fits: Iterable[tuple[Recording, Fit]]) -> list[WindowRow]:
    """One row per corpus and model, in the order first seen, then the pooled row."""
    groups: dict[str, WindowRow] = {}
    pooled = WindowRow("all")
    for recording, found in fits:
        name = _group(recording)
        groups.setdefault(name, WindowRow(name)).add(found)
        pooled.add(found)
    if len(groups) == 1:
        return list(groups.values())
    return [*groups.values(), pooled]


def window_table(found: list[WindowRow], check: WindowCheck, source: str) -> Table:
    window = check.window
    title = (
        f"window {window.context:,} tokens, {window.output:,} for the answer ({source}): a "
        f"request over {check.limit:,} tokens does not fit; Keel's context budget "
        f"{check.budget:,}, results cut at {check.result_cap:,} characters"
    )
    unsized = sum(row.unsized for row in found[-1:])
    caption = f"{unsized} results have no recorded size and count as empty" if unsized else None
    grid = Table(title=title, title_justify="left", caption=caption, caption_justify="left")
    for header in (
        "corpus / model",
        "runs",
        "over the window, nothing elided",
        "median turn",
        "over after Keel fits it",
        "median turn",
        "newest batch alone too big",
        "largest request",
        "largest elided request",
    ):
        grid.add_column(header, justify="left" if header == "corpus / model" else "right")
    for row in found:
        grid.add_row(
            Text(row.name),
            str(row.runs),
            _share(len(row.over), row.runs),
            _turn(row.over),
            _share(len(row.kept_over), row.runs),
            _turn(row.kept_over),
            str(row.batch_too_big) if row.kept_over else "-",
            f"{row.largest:,}",
            f"{row.largest_kept:,}",
        )
    return grid


def _median(turns: list[int]) -> float | None:
    return statistics.median(turns) if turns else None


def _turn(turns: list[int]) -> str:
    middle = _median(turns)
    return "-" if middle is None else f"{middle:g}"
