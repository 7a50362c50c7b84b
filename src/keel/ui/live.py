"""A run's page, live: server-sent events that follow the store while the run may change.

The stream polls the read-only store, SQLite or Postgres alike (the RunStore's `get_run` and
`events(run_id, after)`), for events past the last sequence number the page has (`after`, or
the browser's `Last-Event-ID` when it reconnects), and sends one `update` per change: the new
timeline rows, and the summary and charts when they changed, all rendered and escaped on the
server. When the run has ended (completed, failed, cancelled) it sends `end` and closes. A
queued or paused run stays followed, so a decision made elsewhere, and the resume after it
(here or on a worker), show up too. Ctrl-C on `keel ui` closes every stream at its next poll,
so the server stops at once instead of waiting out its graceful-shutdown timeout.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable

from keel.records import Event
from keel.store import RunRecord, RunStore
from keel.ui.pages import LIVE_STATUSES, Pages, RunView

__all__ = ["POLL_SECONDS", "follow"]

POLL_SECONDS = 0.25
KEEPALIVE_SECONDS = 15.0


async def follow(
    store: RunStore,
    pages: Pages,
    run_id: str,
    after: int,
    note: Callable[[str], str | None],
    stopping: Callable[[], bool] = lambda: False,
    poll: float = POLL_SECONDS,
) -> AsyncIterator[str]:
    """The event stream of one run's page, as SSE text.

    Each round reads the run first and its new events second: a step's state and events are
    saved in one transaction, so the events read cover every state seen, and the `end` of a
    run is never sent before its last rows. When the server is `stopping`, the stream just
    closes (no `end`): the browser retries, and a restarted `keel ui` picks up from there."""
    events: list[Event] = []
    sent: dict[str, str] | None = None
    """The summary and charts the page shows; they hold the Approve/Deny forms, so sending them
    again unchanged would wipe what a person is typing."""
    quiet = 0.0
    while True:
        record: RunRecord | None = await asyncio.to_thread(store.get_run, run_id)
        if record is None:
            yield _message("end", {"reason": "no such run"})
            return
        new = await asyncio.to_thread(store.events, run_id, events[-1].seq if events else -1)
        events.extend(new)
        fresh = [e for e in new if e.seq > after]
        view = RunView(record, events, note(run_id))
        parts = pages.fragments(view, fresh)
        if sent is None:  # the page was rendered at `after`: what it shows is not news
            sent = {} if fresh else {k: v for k, v in parts.items() if k != "rows"}
        changed = {k: v for k, v in parts.items() if k != "rows" and v != sent.get(k)}
        if fresh or changed:
            sent.update(changed)
            payload = {"seq": view.last_seq, **changed, "rows": parts["rows"] if fresh else ""}
            yield _message("update", payload, view.last_seq)
            after, quiet = view.last_seq, 0.0
        if record.status not in LIVE_STATUSES:
            yield _message("end", {"status": record.status})
            return
        await asyncio.sleep(poll)
        if stopping():
            return
        quiet += poll
        if quiet >= KEEPALIVE_SECONDS:
            yield ": keep-alive\n\n"
            quiet = 0.0


def _message(kind: str, data: dict[str, object], seq: int | None = None) -> str:
    head = f"id: {seq}\n" if seq is not None else ""
    return f"{head}event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"
