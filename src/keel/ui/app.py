"""The web view's routes: runs, one run, approvals, the live stream, and the two decisions.

Pages read the store, a SQLite file or Postgres, through one read-only `RunStore` (nothing a
page does can write to it); a decision opens a writable one for that request only, then the run
goes on: a `keel resume` here, or the workers' queue on Postgres (`actions.py`). Every request
first passes the Host guard, every decision the CSRF check (`security.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Collection
from pathlib import Path
from typing import Literal
from urllib.parse import quote

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from keel import approvals
from keel.errors import AlreadyDecided, ConfigError, DecisionExpired, StoreError
from keel.result import STATUSES
from keel.store import open_store
from keel.store.locate import is_url
from keel.ui import live
from keel.ui.actions import decide, edited_arguments, going_on
from keel.ui.chart import ChartFold
from keel.ui.live_text import LiveTexts
from keel.ui.pages import PAGE_SIZE, Pages, RunsPage, RunView
from keel.ui.security import FormError, Guard, new_token, parse_form, token_matches

__all__ = ["create_app"]

STATIC = Path(__file__).parent / "static"
APPROVALS_SHOWN = 50


class _Ui:
    """What the handlers share: the store, the pages, the token, the resumer."""

    def __init__(
        self, target: str | Path, hosts: Collection[str], resume: Callable[[str], None] | None
    ) -> None:
        self.target = target
        self.store = open_store(target, read_only=True)
        self.resumer = going_on(target)
        self.resume = resume or self.resumer
        self.csrf = new_token()
        self.pages = Pages(self.csrf, approvals.who(), then=self.resumer.then)
        self.origins = frozenset(f"http://{h}" for h in hosts)
        self.poll = live.POLL_SECONDS
        self.live = live.LiveRuns(self.pages)
        self.gate = asyncio.Semaphore(live.AT_ONCE)
        """The live streams' turns to read and render, shared by all (see `live.AT_ONCE`)."""
        """The chart folds the open pages of a run share (see `live`)."""
        self.answers = None if is_url(target) else LiveTexts(Path(target))
        """The answers being written, from the running processes' live files (SQLite)."""
        self.stopping = False
        """Set when the server is asked to stop: live streams close at their next poll."""

    def html(self, body: str, status: int = 200) -> HTMLResponse:
        return HTMLResponse(body, status_code=status)

    def error(self, status: int, title: str, message: str) -> HTMLResponse:
        return self.html(self.pages.error(title, message), status)

    # -- pages (plain functions: Starlette runs them on its thread pool, off the loop) ------

    def runs(self, request: Request) -> Response:
        status = request.query_params.get("status") or None
        if status is not None and status not in STATUSES:
            return self.error(400, "Unknown status", f"choose one of: {', '.join(STATUSES)}")
        page = _positive(request.query_params.get("page"))
        total = self.store.count_runs(status)
        records = self.store.list_runs(PAGE_SIZE, status=status, offset=(page - 1) * PAGE_SIZE)
        return self.html(self.pages.runs(RunsPage(records, total, status, page)))

    def run(self, request: Request) -> Response:
        view = self._view(request.path_params["run_id"])
        if view is None:
            return self.error(404, "No such run", f"no run {request.path_params['run_id']}")
        return self.html(self.pages.run(view))

    def approvals(self, request: Request) -> Response:
        paused = self.store.list_runs(APPROVALS_SHOWN, status="awaiting_approval")
        views = [RunView(r, [], self.resumer.note(r.run_id)) for r in paused]
        return self.html(self.pages.approvals(views))

    async def follow(self, request: Request) -> Response:
        run_id = request.path_params["run_id"]
        last = request.headers.get("last-event-id") or request.query_params.get("after")
        after = _integer(last, -1)
        stream = live.follow(
            self.store,
            self.pages,
            run_id,
            after,
            self.resumer.note,
            stopping=lambda: self.stopping,
            poll=self.poll,
            live=self.live,
            answer=None if self.answers is None else self.answers.fragment,
            gate=self.gate,
        )
        return StreamingResponse(
            stream,
            media_type="text/event-stream",
            headers={"x-accel-buffering": "no"},
        )

    def _view(self, run_id: str) -> RunView | None:
        """The whole run, for its page; a live run's fold seeds the page's own stream."""
        record = self.store.get_run(run_id)
        if record is None:
            return None
        events = self.store.events(run_id)
        threshold = record.config.limits.loop_threshold
        fold = ChartFold().add(events)
        view = RunView(record, events, self.resumer.note(run_id), fold.chart_set(threshold))
        if view.live:
            self.live.seed(run_id, threshold, fold, view.last_seq)
        return view

    # -- decisions -------------------------------------------------------------------------

    async def approve(self, request: Request) -> Response:
        return await self._decide(request, "approve")

    async def deny(self, request: Request) -> Response:
        return await self._decide(request, "deny")

    async def answer(self, request: Request) -> Response:
        return await self._decide(request, "answer")

    async def _decide(
        self, request: Request, kind: Literal["approve", "deny", "answer"]
    ) -> Response:
        origin = request.headers.get("origin")
        if origin is not None and origin not in self.origins:
            return self.error(403, "Refused", "this form was sent from another site")
        try:
            form = parse_form(request.headers.get("content-type", ""), await request.body())
        except FormError as exc:
            return self.error(exc.status, "Refused", str(exc))
        if not token_matches(self.csrf, form.get("csrf")):
            return self.error(403, "Refused", "the form's token is missing or wrong; reload")
        reason = form.get("reason", "").strip()
        if kind == "deny" and not reason:
            return self.error(400, "A reason is required", "say why; the model is told")
        text = form.get("text", "")
        if kind == "answer" and not text.strip():
            return self.error(400, "An answer is required", "write the call's result")
        try:
            edited = edited_arguments(form.get("arguments", "")) if kind == "approve" else None
        except ValueError as exc:
            return self.error(400, "Not recorded", str(exc))
        run_id, call_id = request.path_params["run_id"], request.path_params["call_id"]
        try:
            ready = await asyncio.to_thread(
                decide,
                self.target,
                run_id,
                call_id,
                approve=kind == "approve",
                by=form.get("by", ""),
                reason=reason or None,
                arguments=edited,
                for_run=kind == "approve" and form.get("for_run") == "on",
                answer=text if kind == "answer" else None,
                call_key=form.get("call_key") or None,
            )
        except DecisionExpired as exc:  # its denial was recorded: the run goes on from it
            await asyncio.to_thread(self._go_on_if_decided, run_id)
            return self.error(409, "Not recorded", str(exc))
        except (ConfigError, AlreadyDecided) as exc:  # decided first by another, or no run
            return self.error(409, "Not recorded", str(exc))
        if ready:  # queued (Postgres) before the page that says so is shown
            await asyncio.to_thread(self.resume, run_id)
        return RedirectResponse(f"/runs/{quote(run_id, safe='')}", status_code=303)

    def _go_on_if_decided(self, run_id: str) -> None:
        store = open_store(self.target)
        try:
            ready = not approvals.pending(store, run_id)
        finally:
            store.close()
        if ready:
            self.resume(run_id)

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            self.store.close()
            if self.answers is not None:
                self.answers.close()


def create_app(
    store: str | Path,
    hosts: Collection[str],
    *,
    resume: Callable[[str], None] | None = None,
) -> Starlette:
    """The web view over the store at `store` (a SQLite file or a `postgresql://` URL),
    answering only to `hosts` (Host header values, with the port). `resume` starts a paused
    run again once every call is decided (default: a `keel resume` process on SQLite, the
    workers' queue on Postgres). Raises StoreError when the store cannot be opened."""
    ui = _Ui(store if is_url(store) else Path(store), hosts, resume)
    routes = [
        Route("/", ui.runs),
        Route("/approvals", ui.approvals),
        Route("/runs/{run_id}", ui.run),
        Route("/runs/{run_id}/live", ui.follow),
        Route("/runs/{run_id}/calls/{call_id}/approve", ui.approve, methods=["POST"]),
        Route("/runs/{run_id}/calls/{call_id}/deny", ui.deny, methods=["POST"]),
        Route("/runs/{run_id}/calls/{call_id}/answer", ui.answer, methods=["POST"]),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(Guard, hosts=hosts)],
        exception_handlers={StoreError: _store_error},
        lifespan=ui.lifespan,
    )
    app.state.ui = ui
    return app


async def _store_error(request: Request, exc: Exception) -> Response:
    ui: _Ui = request.app.state.ui
    return ui.error(503, "The store cannot be read", str(exc))


def _positive(value: str | None) -> int:
    return min(max(1, _integer(value, 1)), 10**9)


def _integer(value: str | None, default: int) -> int:
    try:
        return int(value) if value is not None else default
    except ValueError:
        return default
