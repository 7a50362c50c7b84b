"""The browser tools in a real headless Chromium: a page whose text changes only through
JavaScript is progress to `browser_observe` (evidence resets), an unchanged page is not, and
the host guard covers every request the browser makes. Skipped only when Chromium is missing."""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

import keel
from chromium import HAS_PLAYWRIGHT, needs_chromium
from keel._run.breaker import tier_of
from keel.records import EvidenceReset, ToolResultRecorded
from keel.tools.browser import BrowserToolset, browser_tools
from pageserver import PageServer
from support import call, run_script

ANSWER = {"text": "The counter kept moving."}


def browser(server: PageServer) -> BrowserToolset:
    return browser_tools(allow_hosts=[f"127.0.0.1:{server.port}"], timeout=30)


async def run_in_browser(
    server: PageServer, turns: list[dict[str, Any]], **limits: Any
) -> tuple[Any, BrowserToolset]:
    tools = browser(server)
    try:
        # Time between polls, so a page that changes every 50 ms has changed between them.
        script = {"turns": turns, "on_synthesis": ANSWER, "latency_ms": 250}
        return await run_script(script, list(tools), **limits), tools
    finally:
        await tools.close()


@needs_chromium
async def test_javascript_updates_reset_the_counter(page_server: PageServer) -> None:
    page_server.add_script_page("/live", interval_ms=50, text="processed items:")
    url = page_server.url("/live")
    turns = [call("browser_observe", url=url)] * 4 + [{"text": "Still processing."}]
    out, _ = await run_in_browser(page_server, turns, loop_threshold=3)

    assert out.result.status == "completed", out.result.failure
    assert out.result.synthesized is None
    assert len(out.of_type(EvidenceReset)) == 3
    assert page_server.hits("/live") == 1, "later polls read the open page, not a reload"
    contents = [r.content for r in out.of_type(ToolResultRecorded)]
    assert all("processed items:" in c for c in contents)
    assert len(set(contents)) == 4


@needs_chromium
async def test_the_same_page_over_http_looks_frozen(page_server: PageServer) -> None:
    """The contrast: observe_page sees only the HTML, which never changes, so no reset."""
    page_server.add_script_page("/live", interval_ms=50)
    url = page_server.url("/live")
    out = await run_script(
        {"turns": [call("observe_page", url=url)] * 2, "on_synthesis": ANSWER, "latency_ms": 250},
        keel.web_tools(allow_hosts=["127.0.0.1"]),
        loop_threshold=3,
    )
    assert not out.of_type(EvidenceReset)
    assert out.result.synthesized == "repeated_tool"


@needs_chromium
async def test_an_unchanged_page_does_not_reset(page_server: PageServer) -> None:
    page_server.add_script_page("/still", interval_ms=0, text="rendered by script")
    url = page_server.url("/still")
    out, _ = await run_in_browser(page_server, [call("browser_observe", url=url)] * 2)
    assert out.of_type(ToolResultRecorded)[0].content.endswith("rendered by script 0\n")
    assert not out.of_type(EvidenceReset)


@needs_chromium
async def test_a_page_that_stops_changing_stops_resetting(page_server: PageServer) -> None:
    page_server.add_script_page("/job", interval_ms=50, ticks=3, text="stage")
    url = page_server.url("/job")
    turns = [call("browser_observe", url=url)] * 3 + [{"text": "It settled at stage 3."}]
    out, _ = await run_in_browser(page_server, turns)
    # Poll 1 may or may not catch the page mid-way; by polls 2 and 3 it has settled at 3.
    contents = [r.content for r in out.of_type(ToolResultRecorded)]
    assert contents[1] == contents[2] and contents[2].endswith("stage 3\n")
    assert [r.step for r in out.of_type(EvidenceReset)] in ([], [2])
    counters = out.store.counters(out.result.run_id)
    (counter,) = (c for k, c in counters.items() if tier_of(k) is None)  # not a tier's
    assert counter.count == (2 if contents[0] != contents[1] else 3)


@needs_chromium
async def test_act_clicks_types_and_navigates(page_server: PageServer) -> None:
    page_server.add_page(
        "/form",
        "<h1>Form</h1><input id='q'><button id='go' "
        "onclick=\"document.getElementById('out').textContent='searched: '+"
        "document.getElementById('q').value\">Go</button><p id='out'>idle</p>",
    )
    page_server.add_page("/other", "<p>The other page.</p>")
    tools = browser(page_server)
    act = {t.name: t for t in tools}["browser_act"]
    try:
        form = page_server.url("/form")
        opened = await act.invoke(act.validate({"action": "navigate", "url": form}))
        assert "idle" in opened
        await act.invoke(act.validate({"action": "type", "selector": "#q", "text": "leases"}))
        clicked = await act.invoke(act.validate({"action": "click", "selector": "#go"}))
        assert "searched: leases" in clicked
        moved = await act.invoke(
            act.validate({"action": "navigate", "url": page_server.url("/other")})
        )
        assert moved.startswith(f"URL: {page_server.url('/other')}")
        with pytest.raises(Exception, match="click needs a CSS selector"):
            await act.invoke(act.validate({"action": "click"}))
    finally:
        await tools.close()


@needs_chromium
async def test_the_host_guard_covers_redirects_and_subresources(page_server: PageServer) -> None:
    with PageServer() as internal:
        internal.add_page("/secret", "<p>secret</p>")
        page_server.add_redirect("/hop", internal.url("/secret"))
        page_server.add_page("/img", f"<p>pic</p><img src='{internal.url('/secret')}'>")
        tools = browser(page_server)
        observe = {t.name: t for t in tools}["browser_observe"]
        try:
            for url in (internal.url("/secret"), page_server.url("/hop")):
                with pytest.raises(Exception, match=r"refused to fetch .*loopback"):
                    await observe.invoke(observe.validate({"url": url}))
            shown = await observe.invoke(observe.validate({"url": page_server.url("/img")}))
            assert "pic" in shown
        finally:
            await tools.close()
        assert internal.hits("/secret") == 0


@needs_chromium
def test_one_browser_serves_calls_from_successive_event_loops(page_server: PageServer) -> None:
    """`Agent.run` is one asyncio.run per run: the browser must outlive each caller's loop."""
    page_server.add_script_page("/live", interval_ms=50, text="count:")
    tools = browser(page_server)
    observe = {t.name: t for t in tools}["browser_observe"]

    async def look() -> str:
        return await observe.invoke(observe.validate({"url": page_server.url("/live")}))

    profiles = set(Path(tempfile.gettempdir()).glob("keel-browser-*"))
    first = asyncio.run(look())
    time.sleep(0.2)
    second = asyncio.run(look())
    assert "count:" in first and first != second, "the page kept running between the loops"
    assert page_server.hits("/live") == 1, "the second loop read the same open page"
    asyncio.run(tools.close())
    assert set(Path(tempfile.gettempdir()).glob("keel-browser-*")) == profiles


@needs_chromium
def test_keel_eval_runs_a_browser_scenario(tmp_path: Path) -> None:
    from test_evals import eval_json

    scenario = tmp_path / "dashboard.toml"
    scenario.write_text(
        'question = "Is the dashboard at {base}/dash moving?"\n'
        "[limits]\nloop_threshold = 3\n"
        '[tools]\nnames = ["browser_observe"]\n'
        '[[pages]]\npath = "/dash"\nkind = "script"\ninterval_ms = 50\n'
        "[script]\nlatency_ms = 250\n"
        '[[script.turns]]\nrepeat = 3\nturn = { tool_calls = [{ name = "browser_observe", '
        'arguments = { url = "{base}/dash" } }] }\n'
        '[[script.turns]]\ntext = "Yes, it is moving."\n'
        '[expect]\nstatus = "completed"\nsynthesized = false\nevidence_resets = 2\n'
        'page_hits = { "/dash" = 1 }\n'
    )
    code, report = eval_json(str(scenario))
    assert code == 0, json.dumps(report, indent=1)


def test_missing_chromium_is_a_clear_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(keel.ConfigError, match="Chromium") as info:
        browser_tools(executable_path=tmp_path / "no-chromium")
    message = str(info.value)
    assert "apt-get install chromium" in message and "observe_page" in message


@pytest.mark.skipif(
    not HAS_PLAYWRIGHT, reason="needs playwright (pip install 'keel-runtime[browser]')"
)
async def test_a_browser_that_does_not_start_is_an_error_the_model_reads(tmp_path: Path) -> None:
    fake = tmp_path / "chromium"
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    profiles = set(Path(tempfile.gettempdir()).glob("keel-browser-*"))
    tools = browser_tools(executable_path=fake, timeout=10)
    observe = {t.name: t for t in tools}["browser_observe"]
    with pytest.raises(Exception, match="starting Chromium"):
        await observe.invoke(observe.validate({"url": "http://127.0.0.1:9/"}))
    assert set(Path(tempfile.gettempdir()).glob("keel-browser-*")) == profiles, "profile left"
    await tools.close()
