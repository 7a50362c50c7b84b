"""`keel ui` in a real Chromium (Playwright over Debian's `chromium`, as the browser tools
use it): the runs page, a synthesized run with its synthesis turn and counter chart, approving
(as asked or with edited arguments), denying and answering instead of a paused call through
the forms, a running run's page following it live, and the
answer growing on it while the model writes.

Each test serves a real store with `keel ui --port 0` in a process of its own, and writes
screenshots of what it saw under its temporary folder (`screenshots/`). Skipped only when
Chromium or Playwright is missing."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest

from chromium import needs_chromium
from echo_model import EchoModel
from keel.errors import StoreError
from keel.store import Store
from keel.tools.browser import find_chromium
from keel.tools.browser_session import LAUNCH_ARGS
from ui_runs import make_repo, paused_run, read, run_model, synthesized_run

with suppress(ImportError):  # without playwright, needs_chromium skips them all
    from playwright.sync_api import Page, expect, sync_playwright

pytestmark = needs_chromium
WAIT_MS = 60_000
"""A resume or a run is a process of its own; on a loaded two-core machine it takes seconds."""


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path)


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return tmp_path / "runs.sqlite"


@contextmanager
def keel_ui(store: Path) -> Iterator[str]:
    """`keel ui` on a free loopback port; its URL."""
    process = subprocess.Popen(
        [sys.executable, "-m", "keel", "ui", "--store", str(store), "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        yield process.stdout.readline().strip()
    finally:
        process.terminate()
        process.wait(10)


@contextmanager
def chromium(screenshots: Path) -> Iterator[tuple[Page, Any]]:
    """A page in a fresh headless Chromium, and `shot(name)` to keep a screenshot of it.

    Opened after the test's runs are made: Playwright's sync API keeps an event loop running
    in this thread, and `keel run` (run in-process) needs the thread without one."""
    screenshots.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=find_chromium(), args=list(LAUNCH_ARGS)
        )
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})

            def shot(name: str) -> None:
                page.screenshot(path=screenshots / f"{name}.png", full_page=True)

            yield page, shot
        finally:
            browser.close()


def test_open_the_runs_page_then_a_synthesized_run(store: Path, repo: Path, tmp_path: Path) -> None:
    run_id = synthesized_run(store, repo)
    paused_run(store, repo)
    with keel_ui(store) as url, chromium(tmp_path / "screenshots") as (page, shot):
        page.goto(url)
        expect(page.locator("tr.run")).to_have_count(2)
        expect(page.locator("tr.run").last).to_contain_text("repeated_tool")
        shot("runs")
        page.get_by_role("link", name=run_id).click()
        page.wait_for_url(f"{url}runs/{run_id}")
        synthesis = page.locator("tr.model-request.synthesis")
        expect(synthesis).to_have_count(1)
        expect(synthesis).to_contain_text('synthesis-only (repeated_tool) · tool_choice: "none"')
        chart = page.locator("svg.counter")
        expect(chart).to_be_visible()
        peak = chart.locator("circle.point[data-count='4']")
        expect(peak).to_be_visible()
        assert peak.get_attribute("cy") == chart.locator("line.near").get_attribute("y1")
        expect(chart.locator("line.synthesis-turn")).to_have_attribute("data-step", "5")
        expect(page.locator("#answer")).to_contain_text("It counts calls.")
        shot("synthesized-run")
        chart.screenshot(path=tmp_path / "screenshots" / "counter-chart.png")


def test_approve_a_paused_run_and_see_it_complete(store: Path, repo: Path, tmp_path: Path) -> None:
    run_id = paused_run(store, repo)
    with keel_ui(store) as url, chromium(tmp_path / "screenshots") as (page, shot):
        page.goto(f"{url}runs/{run_id}")
        pending = page.locator("article.pending")
        expect(pending).to_contain_text('"path": "SUMMARY.md"')
        shot("paused-run")
        pending.locator("form.approve input[name=by]").fill("ana")
        pending.locator("form.approve button").click()
        expect(page.locator("#status")).to_have_text("completed", timeout=WAIT_MS)
        expect(page.locator("#answer")).to_contain_text("Wrote SUMMARY.md.")
        expect(page.locator("tr.decision.approved")).to_contain_text("approved by ana")
        shot("approved-run")
    assert (repo / "SUMMARY.md").read_text() == "summary"


def test_deny_with_a_reason_and_see_the_denial_reach_the_answer(
    store: Path, repo: Path, tmp_path: Path
) -> None:
    reason = "the summary belongs in the README"
    with EchoModel("write_file", {"path": "SUMMARY.md", "content": "summary"}) as model:
        out = run_model(
            store, repo, "openai-chat:echo", "--base-url", model.base_url, "--allow-writes"
        )
        assert out["status"] == "awaiting_approval"
        with keel_ui(store) as url, chromium(tmp_path / "screenshots") as (page, shot):
            page.goto(f"{url}runs/{out['run_id']}")
            deny = page.locator("article.pending form.deny")
            deny.locator("input[name=by]").fill("ana")
            deny.locator("input[name=reason]").fill(reason)
            shot("deny-form")
            deny.locator("button").click()
            expect(page.locator("#status")).to_have_text("completed", timeout=WAIT_MS)
            expect(page.locator("tr.decision.denied")).to_contain_text(f"denied by ana: {reason}")
            expect(page.locator("#answer")).to_contain_text(f"Denied by ana: {reason}.")
            shot("denied-run")
    assert not (repo / "SUMMARY.md").exists()


def test_edit_the_arguments_in_the_form_and_see_the_edited_call_run(
    store: Path, repo: Path, tmp_path: Path
) -> None:
    run_id = paused_run(store, repo)
    with keel_ui(store) as url, chromium(tmp_path / "screenshots") as (page, shot):
        page.goto(f"{url}runs/{run_id}")
        approve = page.locator("article.pending form.approve")
        approve.locator("summary").click()
        approve.locator("textarea[name=arguments]").fill(
            json.dumps({"path": "SUMMARY.md", "content": "edited in the browser"})
        )
        approve.locator("input[name=by]").fill("ana")
        shot("edit-form")
        approve.locator("button").click()
        expect(page.locator("#status")).to_have_text("completed", timeout=WAIT_MS)
        expect(page.locator("tr.decision.approved")).to_contain_text("with edited arguments")
        shot("edited-run")
    assert (repo / "SUMMARY.md").read_text() == "edited in the browser"


def test_answer_instead_in_the_form_and_see_nothing_run(
    store: Path, repo: Path, tmp_path: Path
) -> None:
    run_id = paused_run(store, repo)
    with keel_ui(store) as url, chromium(tmp_path / "screenshots") as (page, shot):
        page.goto(f"{url}runs/{run_id}")
        answer = page.locator("article.pending form.answer")
        answer.locator("input[name=by]").fill("bo")
        answer.locator("textarea[name=text]").fill("The summary is kept by hand.")
        answer.locator("button").click()
        expect(page.locator("#status")).to_have_text("completed", timeout=WAIT_MS)
        expect(page.locator("tr.decision")).to_contain_text("answered instead by bo")
        shot("answered-run")
    assert not (repo / "SUMMARY.md").exists()


def test_watch_a_running_run_update_live(store: Path, repo: Path, tmp_path: Path) -> None:
    for i in range(8):
        (repo / f"part{i}.md").write_text(f"part {i}\n")
    script = tmp_path / "slow.json"
    turns = [read(f"part{i}.md") for i in range(8)] + [{"text": "Read all eight parts."}]
    script.write_text(json.dumps({"turns": turns, "latency_ms": 700}))
    command = [sys.executable, "-m", "keel", "run", "Read the parts.", "--model"]
    run = subprocess.Popen(
        [*command, f"script:{script}", "--repo", str(repo), "--store", str(store), "--json"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        run_id = wait_for_a_run(store)
        with keel_ui(store) as url, chromium(tmp_path / "screenshots") as (page, shot):
            page.goto(f"{url}runs/{run_id}")
            expect(page.locator("#status")).to_have_text("running")
            page.evaluate("window.keelNotReloaded = true")
            rows = page.locator("#timeline tr")
            first = rows.count()
            expect(rows).not_to_have_count(first, timeout=WAIT_MS)  # a row arrived
            shot("live-running")
            expect(page.locator("#status")).to_have_text("completed", timeout=WAIT_MS)
            expect(page.locator("#answer")).to_contain_text("Read all eight parts.")
            expect(page.locator("tr.completed")).to_have_count(1)
            assert rows.count() > first + 8
            assert page.evaluate("window.keelNotReloaded") is True, "the page was reloaded"
            expect(page.locator("body")).to_have_attribute("data-ended", "true")
            shot("live-completed")
    finally:
        run.wait(60)


def wait_for_a_run(store: Path, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if store.exists():
            try:
                db = Store(store, read_only=True)
            except StoreError:
                db = None
            if db is not None:
                try:
                    runs = db.list_runs(1)
                finally:
                    db.close()
                if runs:
                    return runs[0].run_id
        time.sleep(0.05)
    raise AssertionError("the run never appeared in the store")


def test_watch_the_answer_grow_while_the_model_writes_it(tmp_path: Path, store: Path) -> None:
    """`keel ui` first (it asks for live text on the store), then a run whose model writes a
    word every 300 ms: the page shows the words as they come, markup as text, and drops them
    for the recorded answer."""
    words = "<b>bold?</b> " + " ".join(f"word{i}" for i in range(20))
    script = tmp_path / "slow.json"
    script.write_text(json.dumps({"turns": [{"text": words}], "stream_ms": 300}))
    Store(store).close()
    with keel_ui(store) as url, chromium(tmp_path / "screenshots") as (page, shot):
        run = subprocess.Popen(
            [sys.executable, "-m", "keel", "run", "Q", "--model", f"script:{script}",
             "--store", str(store), "--json"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            run_id = wait_for_a_run(store)
            page.goto(f"{url}runs/{run_id}")
            growing = page.locator("#live-answer")
            expect(growing).to_contain_text("<b>bold?</b> word", timeout=WAIT_MS)
            assert growing.locator("b").count() == 0  # the model's markup is text
            expect(growing).not_to_contain_text("word19")  # not yet: it is being written
            shot("live-text-growing")
            expect(growing).to_contain_text("word5", timeout=WAIT_MS)
            expect(page.locator("#status")).to_have_text("completed", timeout=WAIT_MS)
            expect(growing).to_be_empty()
            expect(page.locator("#answer")).to_contain_text("word19")
            shot("live-text-recorded")
        finally:
            run.wait(60)
