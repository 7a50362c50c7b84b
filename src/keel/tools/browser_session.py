"""The browser behind the browser tools: one headless Chromium on an event loop of its own.

A Playwright browser belongs to the event loop that started it, and Keel's callers come and go
with their loops (`Agent.run` is one `asyncio.run` per run). So the session runs its own loop on
a daemon thread and every tool call is handed to it: the browser survives from one run to the
next, calls from any loop (or thread) are serialized on it, cancelling a call (a tool timeout)
cancels the work in the browser loop, and `close()` works from anywhere. Sessions still open at
interpreter exit are closed then, so no Chromium or profile folder outlives the process; the
exit hook that does it is registered when the first browser starts, not when Keel is imported.

Network access goes through `GuardProxy`, the browser's only way out, so the host guard sees
every request, redirect hops included, and each connection goes to the address it checked (see
`browser_proxy.py`). Before a navigation the session checks only what needs no lookup (the
scheme, and an address written in the URL): a name is looked up once, by the proxy.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import shutil
import tempfile
import threading
import time
import weakref
from typing import TYPE_CHECKING, Literal

from keel.errors import ToolError
from keel.tools.browser_proxy import REFUSED_HEADER, GuardProxy
from keel.tools.loop_thread import LoopThread
from keel.tools.netguard import Resolver, vet_url

__all__ = [
    "CLOSE_TIMEOUT",
    "LAUNCH_ARGS",
    "MAX_TEXT_CHARS",
    "Action",
    "BrowserError",
    "Session",
]

if TYPE_CHECKING:
    from playwright.async_api import BrowserContext, Page, Playwright, Request, Response

Action = Literal["click", "type", "navigate"]
LAUNCH_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-features=AutofillServerCommunication,OptimizationHints,Translate,MediaRouter",
)
"""The profile is a fresh temporary folder per browser (Playwright passes it as
--user-data-dir), removed on close."""
MAX_TEXT_CHARS = 500_000
"""Visible text read from a page; the executor's size cap applies after this."""
CLOSE_TIMEOUT = 15.0


class BrowserError(ToolError):
    """A page could not be reached or acted on; the message is for the model."""


_OPEN: weakref.WeakSet[Session] = weakref.WeakSet()


class Session:
    """One browser, one page, on a loop of its own; started by the first call."""

    def __init__(
        self,
        executable: str,
        allow_hosts: tuple[str, ...],
        timeout: float,
        resolver: Resolver | None = None,
    ) -> None:
        self.executable = executable
        self.allow_hosts = allow_hosts
        self.resolver = resolver
        self.timeout_ms = timeout * 1000
        self._thread = LoopThread("keel-browser", CLOSE_TIMEOUT)
        self._lock: asyncio.Lock | None = None
        """Serializes calls; made on the session's own loop, anew for each loop."""
        self._playwright: Playwright | None = None
        self._context: BrowserContext | None = None
        self._page: Page | None = None
        self._profile: str | None = None
        self._showing: tuple[str, str] | None = None
        """(URL asked for, URL the page ended at) of the last navigation that succeeded."""
        self._proxy: GuardProxy | None = None
        """Every request of the browser goes through it; it applies the host guard."""

    # -- tool entry points (any loop) ---------------------------------------------------

    async def observe(self, url: str) -> str:
        return await self._thread.run(self._observe(url))

    async def act(
        self, action: Action, selector: str | None, text: str | None, url: str | None
    ) -> str:
        return await self._thread.run(self._act(action, selector, text, url))

    async def close(self) -> None:
        """Close the browser, remove its profile, stop its loop. Safe to call twice."""
        if self._thread.running:
            await self._thread.run(self._shutdown())
        await asyncio.to_thread(self._thread.stop)

    def close_blocking(self) -> None:
        """`close()` for code without an event loop (and for the end of the process)."""
        if self._thread.running:
            with contextlib.suppress(Exception):
                self._thread.submit(self._shutdown()).result(CLOSE_TIMEOUT)
        self._thread.stop()

    # -- on the session's loop -------------------------------------------------------------

    def _serial(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    async def _observe(self, url: str) -> str:
        async with self._serial():
            page = await self._open()
            if self._showing != (url, page.url):
                await self._goto(page, url)
            return await self._snapshot(page)

    async def _act(
        self, action: Action, selector: str | None, text: str | None, url: str | None
    ) -> str:
        async with self._serial():
            page = await self._open()
            try:
                if action == "navigate":
                    if not url:
                        raise BrowserError("navigate needs a url")
                    await self._goto(page, url)
                elif not selector:
                    raise BrowserError(f"{action} needs a CSS selector")
                elif action == "click":
                    await page.click(selector, timeout=self.timeout_ms)
                    await page.wait_for_load_state("load", timeout=self.timeout_ms)
                else:
                    if text is None:
                        raise BrowserError("type needs the text to type")
                    await page.fill(selector, text, timeout=self.timeout_ms)
            except BrowserError:
                raise
            except Exception as exc:
                raise BrowserError(_playwright_message(action, exc)) from None
            return await self._snapshot(page)

    async def _open(self) -> Page:
        if self._page is not None and not self._page.is_closed():
            return self._page
        if self._context is None:
            await self._launch()
        assert self._context is not None
        pages = self._context.pages
        self._page = pages[0] if pages else await self._context.new_page()
        return self._page

    async def _launch(self) -> None:
        """Proxy first, then Playwright's driver, then Chromium with a fresh profile. Anything
        that fails or is cancelled half-way (a tool timeout) is torn down, not leaked."""
        from playwright.async_api import async_playwright

        _register_exit_hook()
        self._profile = tempfile.mkdtemp(prefix="keel-browser-")
        _OPEN.add(self)
        try:
            self._proxy = GuardProxy(self.allow_hosts, self.resolver)
            proxy_url = await self._proxy.start()
            self._playwright = await async_playwright().start()
            self._context = await self._playwright.chromium.launch_persistent_context(
                self._profile,
                executable_path=self.executable,
                headless=True,
                args=list(LAUNCH_ARGS),
                proxy={"server": proxy_url, "bypass": "<-loopback>"},
                service_workers="block",
                accept_downloads=False,
                handle_sigint=False,
                handle_sigterm=False,
                handle_sighup=False,
                timeout=self.timeout_ms,
            )
        except BaseException as exc:
            await asyncio.shield(self._shutdown())
            if isinstance(exc, Exception):
                message = _playwright_message(f"starting Chromium ({self.executable})", exc)
                raise BrowserError(message) from None
            raise

    async def _goto(self, page: Page, url: str) -> None:
        refusal = vet_url(url, self.allow_hosts)
        if refusal is not None:
            raise BrowserError(refusal)
        self._showing = None
        failed: list[str] = []

        def note_failure(request: Request) -> None:
            if request.is_navigation_request():
                failed.append(request.url)

        page.on("requestfailed", note_failure)
        try:
            response = await self._navigate(page, url)
        except Exception as exc:
            # A refused HTTPS tunnel (a redirect hop, say) surfaces as a network error.
            refusals = [r for u in failed if (r := self._refusal_for(u)) is not None]
            message = refusals[-1] if refusals else _playwright_message(f"opening {url}", exc)
            raise BrowserError(message) from None
        finally:
            page.remove_listener("requestfailed", note_failure)
        if response is not None and response.status >= 400:
            if response.headers.get(REFUSED_HEADER.lower()):
                raise BrowserError(await response.text())
            raise BrowserError(f"HTTP {response.status} {response.status_text} for {url}".strip())
        self._showing = (url, page.url)

    async def _navigate(self, page: Page, url: str) -> Response | None:
        """`page.goto`, once more if an error page left by a failed navigation (Chromium
        commits it a moment after the failure) interrupted it."""
        try:
            return await page.goto(url, wait_until="load", timeout=self.timeout_ms)
        except Exception as exc:
            if "interrupted by another navigation" not in str(exc):
                raise
        with contextlib.suppress(Exception):
            await page.wait_for_load_state("load", timeout=self.timeout_ms)
        return await page.goto(url, wait_until="load", timeout=self.timeout_ms)

    def _refusal_for(self, url: str) -> str | None:
        return self._proxy.refusal_for(url) if self._proxy is not None else None

    async def _snapshot(self, page: Page) -> str:
        """URL, title and visible text; nothing time-dependent, so an unchanged page reads the
        same twice (an observation's digest decides whether it progressed)."""
        text = await page.evaluate(
            "(limit) => (document.body ? document.body.innerText : '').slice(0, limit)",
            MAX_TEXT_CHARS,
        )
        lines = [f"URL: {page.url}"]
        title = await page.title()
        if title:
            lines.append(f"Title: {' '.join(title.split())}")
        return "\n".join(lines) + "\n\n" + str(text).strip() + "\n"

    async def _shutdown(self) -> None:
        with contextlib.suppress(Exception):
            if self._context is not None:
                await self._context.close()
        with contextlib.suppress(Exception):
            if self._playwright is not None:
                await self._playwright.stop()
        if self._proxy is not None:
            await self._proxy.close()
        if self._profile is not None:
            await asyncio.to_thread(_remove_profile, self._profile)
        self._page = self._context = self._playwright = None
        self._proxy = self._profile = self._showing = self._lock = None
        _OPEN.discard(self)


_LEFTOVER_PROFILES: set[str] = set()


def _remove_profile(path: str, attempts: int = 20) -> None:
    """Remove a browser profile. A Chromium that is still shutting down may write into it after
    a first removal, so try a few times, and leave what remains for the end of the process."""
    for attempt in range(attempts):
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.exists(path):
            _LEFTOVER_PROFILES.discard(path)
            return
        if attempt + 1 < attempts:
            time.sleep(0.05)
    _LEFTOVER_PROFILES.add(path)


_EXIT_HOOK = threading.Lock()
_exit_hook_registered = False


def _register_exit_hook() -> None:
    """Register `_close_at_exit` once, when a browser is first started."""
    global _exit_hook_registered
    with _EXIT_HOOK:
        if not _exit_hook_registered:
            atexit.register(_close_at_exit)
            _exit_hook_registered = True


def _close_at_exit() -> None:
    """Runs while daemon threads still live, so open browsers can be closed properly."""
    for session in list(_OPEN):
        session.close_blocking()
    for path in list(_LEFTOVER_PROFILES):
        shutil.rmtree(path, ignore_errors=True)


def _playwright_message(doing: str, exc: Exception) -> str:
    """Playwright's messages carry a call log; the first line is what the model needs."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return f"{doing} failed: {first}"
