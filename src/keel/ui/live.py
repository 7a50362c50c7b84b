"""A run's page, live: server-sent events that follow the store while the run may change.

The stream polls the read-only store, SQLite or Postgres alike (the RunStore's `get_run` and
`events(run_id, after)`), for events past the last sequence number the page has (`after`, or
the browser's `Last-Event-ID` when it reconnects), and sends one `update` per change: the new
timeline rows, and the summary and charts when they changed, all rendered and escaped on the
server. When the run has ended (completed, failed, cancelled) it sends `end` and closes. A
queued or paused run stays followed, so a decision made elsewhere, and the resume after it
(here or on a worker), show up too. Ctrl-C on `keel ui` closes every stream at its next poll,
so the server stops at once instead of waiting out its graceful-shutdown timeout.

What an open page costs does not grow with the run. A poll reads the record and the events
after `after`, and renders only when something the page shows has changed (new events, another
record, a new note): a paused or queued run's page costs two small reads every
`IDLE_POLL_SECONDS` while nobody acts, and no rendering. No stream keeps events: the charts
are drawn from a fold of the run's events that the open pages of a run share (`LiveRuns`),
advanced and rendered once per change for all of them, seeded by the page render, and dropped
once no page follows the run (the last `KEEP` stay, for reloads).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field

from keel.records import Event
from keel.result import LIVE
from keel.store import RunStore
from keel.ui.chart import ChartFold
from keel.ui.pages import Pages, RunView

__all__ = ["IDLE_POLL_SECONDS", "KEEP", "POLL_SECONDS", "LiveRuns", "follow"]

POLL_SECONDS = 0.25
IDLE_POLL_SECONDS = 2.0
"""How often a queued or paused run is read: it changes only when a person decides or a worker
takes it, and the page of a decision made here is loaded anew anyway."""
KEEPALIVE_SECONDS = 15.0
KEEP = 4
AT_ONCE = 4
"""Streams that read the store and render at the same time (`gate`); the others wait their
turn. A hundred streams opened on a big run each read and draw it whole once: all at once,
on the event loop, the index and every page waited seconds behind them (issue 33)."""
"""Runs no page follows whose fold is kept, for a reload or a reconnect."""


@dataclass(slots=True)
class _Followed:
    threshold: int
    fold: ChartFold = field(default_factory=ChartFold)
    seq: int = -1
    """The last event folded."""
    charts: str | None = None
    """The charts fragment as of `seq`, once rendered."""


class LiveRuns:
    """The chart folds of the runs whose pages are open, shared by those pages."""

    def __init__(self, pages: Pages, keep: int = KEEP) -> None:
        self.pages = pages
        self.keep = keep
        self._runs: OrderedDict[str, _Followed] = OrderedDict()
        self._views: Counter[str] = Counter()
        self._lock = threading.Lock()
        """`seed` comes from the page's thread, the rest from the event loop."""
        self._reading = asyncio.Lock()
        """One fold advanced at a time: a whole run is read at most once at a time."""

    def seed(self, run_id: str, threshold: int, fold: ChartFold, seq: int) -> None:
        """The fold a page render made of the run up to `seq`: its stream starts from it."""
        with self._lock:
            known = self._runs.get(run_id)
            if known is None or known.seq < seq or known.threshold != threshold:
                self._runs[run_id] = _Followed(threshold, fold, seq)
            self._runs.move_to_end(run_id)
            self._trim()

    @contextlib.contextmanager
    def watching(self, run_id: str) -> Iterator[None]:
        """While a page follows `run_id`, its fold is never dropped."""
        with self._lock:
            self._views[run_id] += 1
        try:
            yield
        finally:
            with self._lock:
                self._views[run_id] -= 1
                if self._views[run_id] <= 0:
                    del self._views[run_id]
                self._trim()

    async def charts(
        self, store: RunStore, run_id: str, threshold: int, new: Sequence[Event], upto: int
    ) -> str:
        """The charts fragment of `run_id` as of seq `upto` or later. The caller has read the
        run up to `upto`, `new` being what it read last: the fold takes what it has not seen
        from there, or reads the run from where it stands when `new` does not reach back."""
        async with self._reading:
            with self._lock:
                run = self._runs.get(run_id)
                if run is None or run.threshold != threshold:
                    run = self._runs[run_id] = _Followed(threshold)
            if run.seq < upto:
                unseen = [e for e in new if e.seq > run.seq]
                if not unseen or unseen[0].seq != run.seq + 1:
                    unseen = await asyncio.to_thread(store.events, run_id, run.seq)
                if unseen:
                    await asyncio.to_thread(run.fold.add, unseen)
                    run.seq, run.charts = unseen[-1].seq, None
                del unseen
            if run.charts is None:
                run.charts = await asyncio.to_thread(self._draw, run.fold, threshold)
            with self._lock:
                if run_id in self._runs:
                    self._runs.move_to_end(run_id)
                self._trim()
            return run.charts

    def _draw(self, fold: ChartFold, threshold: int) -> str:
        return self.pages.charts(fold.chart_set(threshold))

    def __len__(self) -> int:
        return len(self._runs)

    def _trim(self) -> None:
        """Drop the oldest folds no page follows, beyond `keep` of them."""
        idle = [r for r in self._runs if r not in self._views]
        for run_id in idle[: max(0, len(idle) - self.keep)]:
            del self._runs[run_id]


async def follow(
    store: RunStore,
    pages: Pages,
    run_id: str,
    after: int,
    note: Callable[[str], str | None],
    stopping: Callable[[], bool] = lambda: False,
    poll: float = POLL_SECONDS,
    live: LiveRuns | None = None,
    answer: Callable[[str], str] | None = None,
    gate: asyncio.Semaphore | None = None,
) -> AsyncIterator[str]:
    """The event stream of one run's page, as SSE text; `live` shares the charts' folds with
    the other open pages (a stream of its own without).

    Each round reads the run first and its new events second: a step's state and events are
    saved in one transaction, so the events read cover every state seen, and the `end` of a
    run is never sent before its last rows. When the server is `stopping`, the stream just
    closes (no `end`): the browser retries, and a restarted `keel ui` picks up from there.
    `answer`: the escaped text a running run's model is writing (`live_text.py`), sent as a
    `text` message each time it changes, and as "" once it is gone."""
    live = live if live is not None else LiveRuns(pages)
    gate = gate if gate is not None else asyncio.Semaphore(AT_ONCE)
    with live.watching(run_id):
        shown: object = None
        """The record and the note the page shows: nothing is rendered while they stay."""
        sent: dict[str, str] | None = None
        """The summary and charts the page shows; they hold the Approve/Deny forms, so sending
        them again unchanged would wipe what a person is typing."""
        quiet = 0.0
        """Seconds since anything was sent."""
        writing = ""
        """The growing answer the page shows."""
        while True:
            update: str | None = None
            async with gate:  # a few streams read and render at once; the pages go on meanwhile
                record = await asyncio.to_thread(store.get_run, run_id)
                new = await asyncio.to_thread(store.events, run_id, after) if record else []
                now = (record, note(run_id))
                if record is not None and (new or now != shown):
                    last = new[-1].seq if new else after
                    threshold = record.config.limits.loop_threshold
                    view = RunView(record, [], now[1])
                    parts = {
                        "summary": await asyncio.to_thread(pages.summary, view),
                        "charts": await live.charts(store, run_id, threshold, new, last),
                    }
                    if sent is None:  # the page was rendered at `after`: what it shows is not news
                        sent = {} if new else dict(parts)
                    changed = {k: v for k, v in parts.items() if v != sent.get(k)}
                    if new or changed:
                        sent.update(changed)
                        rows = await asyncio.to_thread(pages.rows, new) if new else ""
                        update = _message("update", {"seq": last, **changed, "rows": rows}, last)
                        after, quiet = last, 0.0
                    shown = now
                del new  # nothing of the run is held between polls
            if record is None:
                yield _message("end", {"reason": "no such run"})
                return
            if update is not None:  # sent with the gate open: a slow reader holds up no one
                yield update
                del update
            if answer is not None:
                running = record.status == "running"
                growing = await asyncio.to_thread(answer, run_id) if running else ""
                if growing != writing:
                    yield _message("text", {"html": growing})
                    writing = growing
            if record.status not in LIVE:
                yield _message("end", {"status": record.status})
                return
            waited = 0.0
            due = poll if record.status == "running" else max(poll, IDLE_POLL_SECONDS)
            while waited < due:  # wake each `poll` to see whether the server stops
                await asyncio.sleep(poll)
                if stopping():
                    return
                waited += poll
            quiet += waited
            if quiet >= KEEPALIVE_SECONDS:
                yield ": keep-alive\n\n"
                quiet = 0.0


def _message(kind: str, data: dict[str, object], seq: int | None = None) -> str:
    head = f"id: {seq}\n" if seq is not None else ""
    return f"{head}event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"
