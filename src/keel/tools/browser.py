"""Browser tools: look at and act on pages in a real, headless Chromium (through Playwright).

`observe_page` reads a page over HTTP, so it never sees what JavaScript writes: a build
dashboard or a job status that updates itself in the browser looks frozen to it. These tools
drive a real browser so such pages can be polled (an observation whose changed text is progress,
ADR 0003) and used (click, type, navigate).

One browser per toolset, started on first use and kept for the next calls, so a page stays
open between polls and a second ``browser_observe`` of the same URL reads the page as it is now
instead of reloading it. Calls are serialized (one page, one action at a time) even though the
executor runs observations of a batch concurrently. Every request the browser makes, not only
the URL the model gave, passes the host guard (`keel.tools.netguard`): the browser's only way
out is a guard proxy on loopback (`browser_proxy.py`), so redirect hops, frames, scripts,
fetches and WebSockets are checked alike, each connected to the address that was checked, and
a page cannot walk the browser into the local network. The browser runs on an event loop of
its own (`browser_session.py`), so it serves run after run whatever loop the caller uses;
``await toolset.close()`` (or the end of the process) shuts it down and removes its temporary
profile.

Playwright's own browser downloads are not used: Keel runs Chromium as installed by the system
(``apt-get install chromium``) or the one named by `executable_path` / ``KEEL_CHROMIUM``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Collection
from pathlib import Path

from keel.errors import ConfigError
from keel.tools.base import Effect, Tool, make_tool
from keel.tools.browser_session import Action, BrowserError, Session
from keel.tools.netguard import Resolver

__all__ = ["CHROMIUM_NAMES", "BrowserToolset", "browser_tools", "find_chromium"]

__all__ = ["BrowserError", "BrowserToolset", "browser_tools", "find_chromium"]

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


class BrowserToolset(list[Tool]):
    """The browser tools, plus `close()` for the browser they share."""

    def __init__(self, tools: list[Tool], session: Session) -> None:
        super().__init__(tools)
        self.session = session

    async def close(self) -> None:
        await self.session.close()


def find_chromium() -> str | None:
    """``KEEL_CHROMIUM``, else the first Chromium or Chrome on PATH."""
    configured = os.environ.get("KEEL_CHROMIUM")
    if configured:
        return configured
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


def browser_tools(
    *,
    allow_hosts: Collection[str] = (),
    executable_path: str | os.PathLike[str] | None = None,
    timeout: float = 30.0,
    resolver: Resolver | None = None,
) -> BrowserToolset:
    """`browser_observe` and `browser_act` (both observations), sharing one lazy browser.

    `allow_hosts` as for `web_tools`; `resolver` looks up each host the browser connects to
    (the system's by default), once per connection, on the browser's own event loop.

    Raises ConfigError when Playwright or Chromium is missing, saying what to install; the
    HTTP tools (`fetch`, `observe_page`) do not need either.
    """
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        raise ConfigError(
            "the browser tools need the playwright package (pip install 'keel-runtime[browser]'); "
            "observe_page still reads pages over HTTP without it"
        ) from None
    exe = str(executable_path) if executable_path is not None else find_chromium()
    if exe is None or not Path(exe).is_file():
        where = f"{exe!r} does not exist" if exe else "none was found on PATH"
        raise ConfigError(
            f"the browser tools need Chromium and {where}: install it (apt-get install chromium) "
            "or pass its path (executable_path, or KEEL_CHROMIUM); observe_page still reads "
            "pages over HTTP without it"
        )
    session = Session(exe, tuple(allow_hosts), timeout, resolver)

    async def browser_observe(url: str) -> str:
        """Show the visible text of a web page as a browser renders it, JavaScript included.
        The first call opens the URL; later calls with the same URL read the page as it is now,
        without reloading, so a page that updates itself (a dashboard, a job status) can be
        watched: changed text counts as progress, unchanged text does not. The first lines give
        the URL and the title. Hosts on the local network are refused.
        """
        return await session.observe(url)

    async def browser_act(
        action: Action,
        selector: str | None = None,
        text: str | None = None,
        url: str | None = None,
    ) -> str:
        """Act on the page open in the browser, then show its visible text.
        action "click" clicks the element matching the CSS selector; "type" fills the input
        matching selector with text; "navigate" opens url (reloading it if already open).
        """
        return await session.act(action, selector, text, url)

    tools = [
        make_tool(
            fn,
            description=" ".join((fn.__doc__ or "").split()),
            effect=Effect.OBSERVATION,
            timeout=timeout,
        )
        for fn in (browser_observe, browser_act)
    ]
    return BrowserToolset(tools, session)
