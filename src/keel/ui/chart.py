"""The counter chart: per call key, its identical-call counter over the run's steps, against the
threshold T, with the T-1 line (where the next turn becomes synthesis-only) and the synthesis
turn drawn.

The counters are computed from the run's typed events, the same way the breaker keeps them: a
`tool_call` event adds one to its key, an `evidence_reset` sets its key back to 1 (the page
progressed). The geometry is computed here; the SVG is drawn by a template, so every label (a
call key is model-written text) is escaped like the rest of the page.

What the charts need of the events is folded one event at a time (`ChartFold`): a page that
follows a run adds the run's new events to its fold instead of reading and counting the whole
run again at every change, and holds no event once it is folded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from keel.records import (
    Event,
    EvidenceReset,
    ModelRequestSent,
    RunFailed,
    ToolCallRequested,
)

__all__ = ["Chart", "ChartFold", "ChartSet", "KeySeries", "charts", "counter_series"]

WIDTH, HEIGHT = 640, 150
LEFT, RIGHT, TOP, BOTTOM = 34, 14, 12, 24
MAX_CHARTS = 12
"""Keys charted per run, most repeated first; the rest are counted in a note."""


@dataclass(slots=True)
class KeySeries:
    """One key's counter: its value after each step where it changed."""

    key: str
    points: list[tuple[int, int]] = field(default_factory=list)
    """(step, counter after that step), one per step where the counter changed."""
    resets: list[int] = field(default_factory=list)
    """Steps where an evidence reset put the counter back to 1."""

    @property
    def peak(self) -> int:
        return max((count for _, count in self.points), default=0)

    def set(self, step: int, count: int) -> None:
        if self.points and self.points[-1][0] == step:
            self.points[-1] = (step, count)
        else:
            self.points.append((step, count))


def counter_series(events: Sequence[Event]) -> dict[str, KeySeries]:
    """Every call key's counter over the steps, in order of first call."""
    return ChartFold().add(events).series


@dataclass(slots=True)
class ChartFold:
    """Everything the charts are drawn from, event by event: the counters, the last step, the
    key that tripped the breaker, the synthesis turns."""

    series: dict[str, KeySeries] = field(default_factory=dict)
    last_step: int = 0
    tripped: tuple[str, int, int] = ("", 0, 0)
    """(key, count, step) of the last loop failure that tripped the hard breaker."""
    synthesis: list[tuple[int, str]] = field(default_factory=list)
    """(step, reason) of each synthesis-only request (its first attempt)."""

    def add(self, events: Sequence[Event]) -> ChartFold:
        """Fold `events`, the run's next ones in order; returns self."""
        series = self.series
        for event in events:
            self.last_step = max(self.last_step, event.step)
            if isinstance(event, ToolCallRequested):
                one = series.setdefault(event.call_key, KeySeries(event.call_key))
                one.set(event.step, (one.points[-1][1] if one.points else 0) + 1)
            elif isinstance(event, EvidenceReset):
                one = series.setdefault(event.call_key, KeySeries(event.call_key))
                one.set(event.step, 1)
                one.resets.append(event.step)
            elif isinstance(event, ModelRequestSent):
                if event.synthesis is not None and event.attempt == 1:
                    self.synthesis.append((event.step, event.synthesis))
            elif isinstance(event, RunFailed):
                self.tripped = _tripped(event) or self.tripped
        return self

    def chart_set(self, threshold: int) -> ChartSet:
        """The charts of the keys that repeated (or were reset), most repeated first."""
        return _draw(self, threshold)


def charts(events: Sequence[Event], threshold: int) -> ChartSet:
    """The charts of the keys that repeated (or were reset), most repeated first."""
    return ChartFold().add(events).chart_set(threshold)


@dataclass(frozen=True, slots=True)
class Mark:
    x: float
    y: float
    step: int
    count: int


@dataclass(frozen=True, slots=True)
class Chart:
    """One key's chart, in SVG coordinates."""

    key: str
    peak: int
    path: str
    """The counter as a step line: an SVG path."""
    marks: tuple[Mark, ...]
    resets: tuple[Mark, ...]
    tripped: Mark | None
    """Where the hard breaker stopped the run: the count this key would have reached."""


@dataclass(frozen=True, slots=True)
class ChartSet:
    """The run's charts and what they share: the axes, T, T-1 and the synthesis turns."""

    threshold: int
    last_step: int
    charts: tuple[Chart, ...]
    others: int
    """Keys not charted (called once each, or past MAX_CHARTS)."""
    y_threshold: float
    y_near: float
    synthesis: tuple[tuple[int, float, str], ...]
    """(step, x, reason) of each synthesis-only request."""
    x_ticks: tuple[tuple[int, float], ...]
    y_ticks: tuple[tuple[int, float], ...]
    width: int = WIDTH
    height: int = HEIGHT
    left: int = LEFT
    right: int = WIDTH - RIGHT
    top: int = TOP
    bottom: int = HEIGHT - BOTTOM


def _draw(fold: ChartFold, threshold: int) -> ChartSet:
    series, tripped = fold.series, fold.tripped
    last_step = fold.last_step or 1
    wanted = sorted(
        (s for s in series.values() if s.peak >= 2 or s.resets or s.key == tripped[0]),
        key=lambda s: -max(s.peak, tripped[1] if s.key == tripped[0] else 0),
    )
    top = max(threshold, tripped[1])

    span = last_step + 1  # room after the last step, where a final synthesis turn is drawn

    def x(step: int) -> float:
        return round(LEFT + (WIDTH - RIGHT - LEFT) * step / span, 1)

    def y(count: int) -> float:
        return round(HEIGHT - BOTTOM - (HEIGHT - BOTTOM - TOP) * count / top, 1)

    drawn = []
    for one in wanted[:MAX_CHARTS]:
        path = [f"M{x(0)},{y(0)}"]
        for step, count in one.points:
            path.append(f"H{x(step)}V{y(count)}")
        path.append(f"H{x(span)}")
        marks = tuple(Mark(x(s), y(c), s, c) for s, c in one.points)
        resets = tuple(Mark(x(s), y(1), s, 1) for s in one.resets)
        trip = None
        if one.key == tripped[0]:
            trip = Mark(x(tripped[2]), y(tripped[1]), tripped[2], tripped[1])
        drawn.append(Chart(one.key, one.peak, "".join(path), marks, resets, trip))
    return ChartSet(
        threshold=threshold,
        last_step=last_step,
        charts=tuple(drawn),
        others=len(series) - len(drawn),
        y_threshold=y(threshold),
        y_near=y(threshold - 1),
        synthesis=tuple((step, x(step), reason) for step, reason in fold.synthesis),
        x_ticks=tuple((s, x(s)) for s in _ticks(last_step)),
        y_ticks=tuple((c, y(c)) for c in _y_ticks(threshold)),
    )


def _tripped(event: RunFailed) -> tuple[str, int, int] | None:
    """(key, count, step) of the key that tripped the hard breaker, or None. A tool request in
    a synthesis turn (details with a "reason") tripped nothing: its key stood at T-1."""
    if event.kind != "ToolLoopDetected" or "reason" in event.details:
        return None
    key, count = event.details.get("call_key"), event.details.get("count")
    if isinstance(key, str) and isinstance(count, int):
        return key, count, event.step
    return None


def _y_ticks(threshold: int) -> list[int]:
    """Every count up to a small T; past ten, the ones that matter."""
    return list(range(threshold + 1)) if threshold <= 10 else [0, 1, threshold - 1, threshold]


def _ticks(last: int) -> list[int]:
    """A handful of round step numbers from 0 to `last`."""
    span = next(s for s in (1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 10**9) if last / s <= 10)
    return [*range(0, last, span), last]
