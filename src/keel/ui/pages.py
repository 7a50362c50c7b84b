"""The pages, as functions from what the store holds to HTML: no I/O here.

One Jinja environment with autoescape on for every template (pages, live fragments, the SVG
charts), and `StrictUndefined`, so a misspelt field fails a test instead of rendering blank.
The filters clean untrusted text before it is escaped (see `text.py`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import quote

from jinja2 import Environment, PackageLoader, StrictUndefined

from keel.records import Decision, Event
from keel.result import LIVE, STATUSES, PendingApproval
from keel.store import RunRecord
from keel.ui import text
from keel.ui.chart import ChartSet, charts

__all__ = ["PAGE_SIZE", "Pages", "RunView", "RunsPage"]

PAGE_SIZE = 50


@dataclass(frozen=True, slots=True)
class RunsPage:
    records: Sequence[RunRecord]
    total: int
    status: str | None
    page: int

    @property
    def pages(self) -> int:
        return max(1, -(-self.total // PAGE_SIZE))

    @property
    def rows(self) -> list[tuple[RunRecord, bool]]:
        """The page's runs with each conversation's together (ADR 0038), in the place of its
        newest run, oldest first within it; True marks a follow-up."""
        groups: dict[str, list[RunRecord]] = {}
        for record in self.records:
            groups.setdefault(record.conversation_id, []).append(record)
        return [
            (record, record.config.continues_from is not None)
            for runs in groups.values()
            for record in reversed(runs)
        ]


@dataclass(slots=True)
class RunView:
    """One run as its page shows it."""

    record: RunRecord
    events: list[Event]
    note: str | None = None
    """What the UI's last background resume of this run said, when it failed."""
    chart_set: ChartSet | None = None
    """Drawn from `events` unless given (from a fold the caller keeps)."""

    def __post_init__(self) -> None:
        if self.chart_set is None:
            self.chart_set = charts(self.events, self.record.config.limits.loop_threshold)

    @property
    def live(self) -> bool:
        return self.record.status in LIVE

    @property
    def last_seq(self) -> int:
        return self.events[-1].seq if self.events else -1

    @property
    def waiting(self) -> tuple[PendingApproval, ...]:
        """Pending calls nobody has decided on yet (they get the forms)."""
        if self.record.status != "awaiting_approval":
            return ()
        decided = self.record.state.decisions
        return tuple(p for p in self.record.state.pending if p.call_id not in decided)

    @property
    def decided(self) -> list[tuple[PendingApproval, Decision]]:
        """Pending calls already decided, waiting for the run to resume."""
        if self.record.status != "awaiting_approval":
            return []
        decisions = self.record.state.decisions
        pending = self.record.state.pending
        return [(p, decisions[p.call_id]) for p in pending if p.call_id in decisions]


class Pages:
    """Renders every page and fragment; `csrf` goes into each form; `then` says what happens
    once every call of a paused run is decided (resumed here, or queued for a worker)."""

    def __init__(self, csrf: str, by: str, then: str = "resuming…") -> None:
        self.csrf = csrf
        self.by = by
        env = Environment(
            loader=PackageLoader("keel.ui", "templates"),
            autoescape=True,
            undefined=StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        env.filters.update(
            clean=text.clean,
            clip=text.clip,
            short=text.short,
            pretty=text.pretty_json,
            target_first=text.target_first,
            size=text.size,
            age=text.age,
            utc=text.utc,
            path=lambda value: quote(str(value), safe=""),
        )
        env.globals.update(csrf=csrf, by=by, then=then, statuses=STATUSES, now=time.time)
        self.env = env

    def runs(self, page: RunsPage) -> str:
        return self.env.get_template("runs.html").render(page=page)

    def run(self, view: RunView) -> str:
        return self.env.get_template("run.html").render(view=view)

    def approvals(self, views: Sequence[RunView]) -> str:
        return self.env.get_template("approvals.html").render(views=views)

    def error(self, title: str, message: str) -> str:
        return self.env.get_template("error.html").render(title=title, message=message)

    # -- what a live page replaces (summary, charts) and appends (rows) -----------------------

    def summary(self, view: RunView) -> str:
        return self._part("_summary.html", view=view)

    def charts(self, chart_set: ChartSet) -> str:
        return self._part("_charts.html", chart_set=chart_set)

    def rows(self, events: Sequence[Event]) -> str:
        return self._part("_rows.html", events=events)

    def _part(self, name: str, **context: object) -> str:
        return self.env.get_template(name).render(**context)
