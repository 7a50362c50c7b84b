"""`keel ui`: the pages, the decisions and the guards, through Starlette's TestClient over a
real store written by `keel run` (the browser tests are in test_ui_browser.py)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.testclient import TestClient

import keel
from keel.store import Store
from keel.transports.scripted import ScriptedTransport
from keel.ui.app import create_app
from keel.ui.security import served_hosts
from support import call
from ui_runs import (
    decisions,
    hostile_run,
    make_repo,
    paused_run,
    synthesized_run,
)

BASE = "http://127.0.0.1:8350"
CALL = "k1_0"
"""Keel's id for the paused run's write (step 1, first call; ADR 0030)."""


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path)


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return tmp_path / "runs.sqlite"


def client(store: Path) -> TestClient:
    return TestClient(create_app(store, served_hosts("127.0.0.1", 8350)), base_url=BASE)


@pytest.fixture
def ui(store: Path, repo: Path) -> Iterator[TestClient]:
    synthesized_run(store, repo)  # the store must exist before the view opens it
    with client(store) as c:
        yield c


def csrf(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found, "the page has no form"
    return found.group(1)


def wait_for_status(store: Path, run_id: str, wanted: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while decisions(store, run_id)[1] != wanted:
        assert time.monotonic() < deadline, f"run {run_id} never became {wanted}"
        time.sleep(0.1)


# -- pages -------------------------------------------------------------------------------------


def test_runs_page_lists_runs_with_their_status_and_counts(
    ui: TestClient, store: Path, repo: Path
) -> None:
    paused = paused_run(store, repo)
    page = ui.get("/").text
    assert "2 runs" in page
    assert f'href="/runs/{paused}"' in page
    assert "repeated_tool" in page and "awaiting approval" in page
    filtered = ui.get("/", params={"status": "awaiting_approval"}).text
    assert "1 run awaiting approval" in filtered and paused in filtered
    assert "repeated_tool" not in filtered
    assert ui.get("/", params={"status": "nonsense"}).status_code == 400


def test_runs_page_is_paged_newest_first(ui: TestClient, store: Path, repo: Path) -> None:
    for _ in range(51):
        synthesized_run(store, repo)
    first = ui.get("/").text
    second = ui.get("/", params={"page": 2}).text
    assert "52 runs · page 1 of 2" in first and 'rel="next"' in first
    rows = [re.findall(r'<tr class="run ', page) for page in (first, second)]
    assert [len(r) for r in rows] == [50, 2]
    newest = Store(store, read_only=True)
    try:
        ids = [r.run_id for r in newest.list_runs(52)]
    finally:
        newest.close()
    assert first.index(ids[0]) < first.index(ids[49]) and ids[51] in second


def test_run_page_marks_the_synthesis_turn_and_charts_the_counter_to_t_minus_1(
    ui: TestClient, store: Path, repo: Path
) -> None:
    run_id = synthesized_run(store, repo)
    page = ui.get(f"/runs/{run_id}").text
    assert 'class="ev model-request synthesis"' in page
    assert 'synthesis-only (repeated_tool) · tool_choice: <code>"none"</code>' in page
    (svg,) = re.findall(r"<svg class=\"counter\".*?</svg>", page, re.S)
    assert 'data-peak="4"' in svg and 'data-threshold="5"' in svg
    assert re.search(r'class="synthesis-turn"[^>]*data-step="5"', svg)
    assert "T-1 = 4" in svg and "T = 5" in svg
    counts = [int(c) for c in re.findall(r'data-count="(\d+)"', svg)]
    assert counts == [1, 2, 3, 4]
    assert "synthesized: repeated_tool" in page and "It counts calls." in page


def test_counters_are_computed_from_events_like_the_breaker(store: Path, repo: Path) -> None:
    """The chart's counters (tool_call +1, evidence_reset back to 1) end where the store's
    identical-call counters do (a repeat tier's counters, ADR 0050, are not charted)."""
    from keel._run.breaker import tier_of
    from keel.ui.chart import counter_series

    run_id = synthesized_run(store, repo)
    db = Store(store, read_only=True)
    try:
        series = counter_series(db.events(run_id))
        stored = db.counters(run_id)
    finally:
        db.close()
    assert {k: s.points[-1][1] for k, s in series.items()} == {
        k: c.count for k, c in stored.items() if tier_of(k) is None
    }


def test_html_in_tool_results_and_answers_is_escaped(
    ui: TestClient, store: Path, repo: Path
) -> None:
    run_id = hostile_run(store, repo)
    page = ui.get(f"/runs/{run_id}").text
    assert "<script>alert" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page  # the tool result, as text
    assert "Answer: &lt;script&gt;alert(2)&lt;/script&gt;" in page
    runs = ui.get("/").text
    assert "<script>alert" not in runs


def test_terminal_control_characters_are_stripped(ui: TestClient, store: Path, repo: Path) -> None:
    run_id = hostile_run(store, repo)
    page = ui.get(f"/runs/{run_id}").text
    assert "&lt;/script&gt;red evil" in page  # colour codes, the OSC title, bidi override gone
    for control in ("\x1b", "\x07", "\u202e", "[31m", "]0;owned"):
        assert control not in page


def test_pages_answer_only_to_the_served_host(ui: TestClient) -> None:
    assert ui.get("/").status_code == 200
    assert ui.get("/", headers={"host": "localhost:8350"}).status_code == 200
    for host in ("evil.example:8350", "127.0.0.1:8351", "attacker.test", ""):
        refused = ui.get("/", headers={"host": host})
        assert refused.status_code == 403, host
        assert "Keel" not in refused.text


def test_pages_never_write_to_the_store(ui: TestClient, store: Path, repo: Path) -> None:
    """Pages read through a read-only store: browsing leaves the file and its write-ahead log
    as they were."""
    paused, done = paused_run(store, repo), synthesized_run(store, repo)
    wal = store.with_name(store.name + "-wal")

    def state() -> tuple[bytes, int, bytes]:
        return store.read_bytes(), store.stat().st_mtime_ns, wal.read_bytes()

    before = state()
    for url in ("/", "/approvals", f"/runs/{paused}", f"/runs/{done}", "/?status=failed"):
        assert ui.get(url).status_code == 200
    assert "event: end" in ui.get(f"/runs/{done}/live").text
    assert state() == before


def test_every_response_forbids_inline_script_and_framing(ui: TestClient) -> None:
    policy = ui.get("/").headers["content-security-policy"]
    assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert "unsafe-inline" not in policy


# -- decisions ---------------------------------------------------------------------------------


def test_post_without_csrf_token_is_refused_and_records_nothing(
    ui: TestClient, store: Path, repo: Path
) -> None:
    run_id = paused_run(store, repo)
    before = decisions(store, run_id)
    url = f"/runs/{run_id}/calls/{CALL}/approve"
    assert ui.post(url, data={"by": "mallory"}).status_code == 403
    assert ui.post(url, data={"by": "mallory", "csrf": "guessed"}).status_code == 403
    time.sleep(0.5)  # a resume, had one been started, would have moved the run by now
    assert decisions(store, run_id) == before


def test_post_with_a_foreign_host_is_refused_and_records_nothing(
    ui: TestClient, store: Path, repo: Path
) -> None:
    run_id = paused_run(store, repo)
    token = csrf(ui.get(f"/runs/{run_id}").text)
    before = decisions(store, run_id)
    refused = ui.post(
        f"/runs/{run_id}/calls/{CALL}/deny",
        data={"csrf": token, "by": "mallory", "reason": "x"},
        headers={"host": "rebound.example:8350"},
    )
    assert refused.status_code == 403
    foreign_origin = ui.post(
        f"/runs/{run_id}/calls/{CALL}/approve",
        data={"csrf": token, "by": "mallory"},
        headers={"origin": "http://evil.example"},
    )
    assert foreign_origin.status_code == 403
    time.sleep(0.5)
    assert decisions(store, run_id) == before


def test_deny_requires_a_reason(ui: TestClient, store: Path, repo: Path) -> None:
    run_id = paused_run(store, repo)
    token = csrf(ui.get(f"/runs/{run_id}").text)
    before = decisions(store, run_id)
    response = ui.post(
        f"/runs/{run_id}/calls/{CALL}/deny", data={"csrf": token, "by": "ana", "reason": "  "}
    )
    assert response.status_code == 400
    assert decisions(store, run_id) == before


def test_approve_records_the_decision_and_resumes_the_run(
    ui: TestClient, store: Path, repo: Path
) -> None:
    run_id = paused_run(store, repo)
    page = ui.get(f"/runs/{run_id}").text
    assert "Waiting for approval" in page and "SUMMARY.md" in page
    response = ui.post(
        f"/runs/{run_id}/calls/{CALL}/approve",
        data={"csrf": csrf(page), "by": "ana"},
        follow_redirects=False,
    )
    assert response.status_code == 303 and response.headers["location"] == f"/runs/{run_id}"
    wait_for_status(store, run_id, "completed")
    assert (repo / "SUMMARY.md").read_text() == "summary"
    done = ui.get(f"/runs/{run_id}").text
    assert "approved by <strong>ana</strong>" in done and "Wrote SUMMARY.md." in done
    again = ui.post(f"/runs/{run_id}/calls/{CALL}/approve", data={"csrf": csrf(page)})
    assert again.status_code == 409  # decided already: nothing pending


def test_a_run_the_command_line_cannot_resume_says_why_on_its_page(store: Path) -> None:
    """A library run with its own tool: `keel resume` cannot rebuild it, exits 2, and the run's
    page shows what it said (the decision itself is recorded)."""

    @keel.tool(effect="side_effecting", requires_approval=True)
    def publish(text: str) -> str:
        """Publish text."""
        return "published"

    transport = ScriptedTransport.from_dict({"turns": [call("publish", text="hi")]})
    with keel.Agent(transport, tools=[publish], store=store) as agent:
        paused = agent.run("Publish it?")
    assert paused.status == "awaiting_approval"
    with client(store) as ui:
        page = ui.get(f"/runs/{paused.run_id}").text
        ui.post(
            f"/runs/{paused.run_id}/calls/{CALL}/approve", data={"csrf": csrf(page), "by": "ana"}
        )
        deadline = time.monotonic() + 60
        while "resuming this run failed" not in (page := ui.get(f"/runs/{paused.run_id}").text):
            assert time.monotonic() < deadline, "no note about the failed resume"
            time.sleep(0.1)
    assert decisions(store, paused.run_id)[:2] == (1, "awaiting_approval")
    note = re.search(r'<p class="note" id="resume-note">(.*?)</p>', page, re.S)
    assert note and "keel: " in note.group(1)


def test_approvals_page_lists_paused_runs_with_forms(
    ui: TestClient, store: Path, repo: Path
) -> None:
    run_id = paused_run(store, repo)
    page = ui.get("/approvals").text
    assert f"/runs/{run_id}/calls/{CALL}/approve" in page
    assert f"/runs/{run_id}/calls/{CALL}/deny" in page
    assert f"/runs/{run_id}/calls/{CALL}/answer" in page
    assert page.count('name="csrf"') == 3  # approve (edit, for the run), deny, answer instead


# -- live --------------------------------------------------------------------------------------


def test_the_live_stream_sends_rows_after_the_given_seq_then_ends(
    ui: TestClient, store: Path, repo: Path
) -> None:
    run_id = synthesized_run(store, repo)
    with ui.stream("GET", f"/runs/{run_id}/live", params={"after": 3}) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        text = "".join(response.iter_text())
    update, end = text.strip().split("\n\n")
    assert update.startswith("id: ") and "event: update" in update and "event: end" in end
    data = json.loads(update.split("data: ", 1)[1])
    seqs = [int(s) for s in re.findall(r'data-seq="(\d+)"', data["rows"])]
    assert seqs[0] == 4 and seqs[-1] == data["seq"]
    assert json.loads(end.split("data: ", 1)[1]) == {"status": "completed"}


# -- the command -------------------------------------------------------------------------------


def start_ui(store: Path) -> tuple[subprocess.Popen[str], str]:
    """`keel ui` on any free port, and the URL it printed."""
    process = subprocess.Popen(
        [sys.executable, "-m", "keel", "ui", "--store", str(store), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    return process, process.stdout.readline().strip()


def test_keel_ui_serves_on_loopback_and_prints_its_url(store: Path, repo: Path) -> None:
    synthesized_run(store, repo)
    process, url = start_ui(store)
    try:
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/", url), url
        assert "1 run" in httpx.get(url).text
        port = url.rsplit(":", 1)[1].strip("/")
        assert httpx.get(url, headers={"host": f"evil.example:{port}"}).status_code == 403
    finally:
        process.terminate()
        process.wait(10)


def test_stopping_keel_ui_closes_open_live_streams(store: Path, repo: Path) -> None:
    """Ctrl-C with a paused run's page open (its stream never ends by itself): the stream
    closes at its next poll, instead of being cancelled after the graceful-shutdown timeout."""
    run_id = paused_run(store, repo)
    process, url = start_ui(store)
    try:
        with httpx.stream("GET", f"{url}runs/{run_id}/live", timeout=30) as stream:
            lines = stream.iter_lines()
            assert next(lines).startswith("id: ")
            process.send_signal(signal.SIGINT)
            rest = list(lines)  # the server ends the stream
        assert not any("event: end" in line for line in rest)
        _, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert "graceful shutdown exceeded" not in err, err


def test_keel_ui_warns_before_listening_beyond_loopback(store: Path, repo: Path) -> None:
    """192.0.2.1 (TEST-NET-1) is no address of this machine: the warning comes, then the
    bind fails, so nothing is ever reachable from elsewhere."""
    synthesized_run(store, repo)
    done = subprocess.run(
        [sys.executable, "-m", "keel", "ui", "--store", str(store), "--host", "192.0.2.1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "warning: listening on 192.0.2.1, not loopback" in done.stderr
    assert done.returncode == 2 and "cannot listen on 192.0.2.1:8350" in done.stderr


def test_keel_ui_without_a_store_says_so(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "keel", "ui", "--store", str(tmp_path / "none.sqlite")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "no store at" in done.stderr


def test_the_command_line_does_not_import_the_web_libraries() -> None:
    """`keel` works without the `ui` extra: only `keel ui` imports Starlette, uvicorn, Jinja2."""
    code = (
        "import sys, keel.cli.app\n"
        "web = ('starlette', 'uvicorn', 'jinja2', 'keel.ui.app', 'keel.ui.server')\n"
        "print(sorted(m for m in sys.modules if m.startswith(web)))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_live_stream_leaves_a_page_that_is_up_to_date_alone(store: Path, repo: Path) -> None:
    """A paused run's page holds the Approve/Deny forms inside its summary. The stream used to
    send the summary at once on connecting (nothing had been "sent" yet), and the page replaced
    it, wiping what the person had typed: in Chromium the denial went out "by root", not by the
    name typed a moment before. Nothing has changed since the page was rendered, so nothing is
    sent; a real change still is."""
    import asyncio

    from keel.ui.live import follow
    from keel.ui.pages import Pages

    run_id = paused_run(store, repo)
    reader = Store(store, read_only=True)

    async def first_message(after: int, timeout: float) -> str:
        stream = follow(reader, Pages("token", "root"), run_id, after, lambda _: None, poll=0.02)
        try:
            return await asyncio.wait_for(anext(stream), timeout)
        finally:
            await stream.aclose()

    try:
        last = reader.events(run_id, -1)[-1].seq
        with pytest.raises(TimeoutError):  # only keep-alives would come: nothing to update
            asyncio.run(first_message(last, 1.0))
        first = asyncio.run(first_message(last - 1, 5.0))
        assert "event: update" in first and '"summary"' in first
    finally:
        reader.close()


# -- the four decisions (ADR 0052) --------------------------------------------------------------


def test_approve_with_edited_arguments_runs_what_the_person_wrote(
    ui: TestClient, store: Path, repo: Path
) -> None:
    run_id = paused_run(store, repo)
    page = ui.get(f"/runs/{run_id}").text
    assert 'name="arguments"' in page and "edit the arguments" in page
    edited = json.dumps({"path": "SUMMARY.md", "content": "edited by ana"})
    response = ui.post(
        f"/runs/{run_id}/calls/{CALL}/approve",
        data={"csrf": csrf(page), "by": "ana", "arguments": edited, "call_key": shown_key(page)},
        follow_redirects=False,
    )
    assert response.status_code == 303
    wait_for_status(store, run_id, "completed")
    assert (repo / "SUMMARY.md").read_text() == "edited by ana"
    done = ui.get(f"/runs/{run_id}").text
    assert "approved by <strong>ana</strong> with edited arguments" in done


def test_arguments_left_as_shown_are_an_approval_as_asked(
    ui: TestClient, store: Path, repo: Path
) -> None:
    run_id = paused_run(store, repo)
    page = ui.get(f"/runs/{run_id}").text
    shown = re.search(r'<textarea name="arguments"[^>]*>([^<]*)</textarea>', page)
    assert shown is not None
    ui.post(
        f"/runs/{run_id}/calls/{CALL}/approve",
        data={"csrf": csrf(page), "by": "ana", "arguments": html_text(shown.group(1))},
    )
    wait_for_status(store, run_id, "completed")
    record = Store(store).get_run(run_id)
    assert record is not None and record.state.decisions[CALL].arguments is None


def test_edited_arguments_that_do_not_fit_are_refused_and_record_nothing(
    ui: TestClient, store: Path, repo: Path
) -> None:
    run_id = paused_run(store, repo)
    token = csrf(ui.get(f"/runs/{run_id}").text)
    before = decisions(store, run_id)
    for arguments, status in (("{not json", 400), (json.dumps({"path": 3}), 409)):
        response = ui.post(
            f"/runs/{run_id}/calls/{CALL}/approve",
            data={"csrf": token, "by": "ana", "arguments": arguments},
        )
        assert response.status_code == status
    assert decisions(store, run_id) == before


def test_a_form_for_another_call_than_the_pending_one_is_refused(
    ui: TestClient, store: Path, repo: Path
) -> None:
    run_id = paused_run(store, repo)
    token = csrf(ui.get(f"/runs/{run_id}").text)
    before = decisions(store, run_id)
    response = ui.post(
        f"/runs/{run_id}/calls/{CALL}/approve",
        data={"csrf": token, "by": "ana", "call_key": 'write_file {"path":"other.md"}'},
    )
    assert response.status_code == 409
    assert decisions(store, run_id) == before


def test_answer_instead_is_the_calls_result_and_nothing_runs(
    ui: TestClient, store: Path, repo: Path
) -> None:
    run_id = paused_run(store, repo)
    page = ui.get(f"/runs/{run_id}").text
    assert f"/runs/{run_id}/calls/{CALL}/answer" in page
    empty = ui.post(f"/runs/{run_id}/calls/{CALL}/answer", data={"csrf": csrf(page), "text": " "})
    assert empty.status_code == 400
    ui.post(
        f"/runs/{run_id}/calls/{CALL}/answer",
        data={
            "csrf": csrf(page),
            "by": "bo",
            "text": "SUMMARY.md is kept by hand.",
            "call_key": shown_key(page),
        },
    )
    wait_for_status(store, run_id, "completed")
    assert not (repo / "SUMMARY.md").exists()
    record = Store(store).get_run(run_id)
    assert record is not None
    decision = record.state.decisions[CALL]
    assert (decision.answer, decision.by) == ("SUMMARY.md is kept by hand.", "bo")
    assert "answered instead by <strong>bo</strong>" in ui.get(f"/runs/{run_id}").text


def test_approve_for_the_run_is_recorded_with_the_decision(
    ui: TestClient, store: Path, repo: Path
) -> None:
    run_id = paused_run(store, repo)
    page = ui.get(f"/runs/{run_id}").text
    ui.post(
        f"/runs/{run_id}/calls/{CALL}/approve",
        data={"csrf": csrf(page), "by": "ana", "for_run": "on"},
    )
    wait_for_status(store, run_id, "completed")
    record = Store(store).get_run(run_id)
    assert record is not None and record.state.decisions[CALL].for_run
    assert "write_file" in record.state.approved_for_run


def shown_key(page: str) -> str:
    found = re.search(r'name="call_key" value="([^"]+)"', page)
    assert found, "the form carries no call key"
    return html_text(found.group(1))


def html_text(escaped: str) -> str:
    import html

    return html.unescape(escaped)


def test_a_decision_past_the_calls_expiry_is_refused_and_the_run_goes_on_denied(
    ui: TestClient, store: Path, repo: Path
) -> None:
    from ui_runs import keel_run

    write = {"tool_calls": [{"name": "write_file", "arguments": {"path": "S.md", "content": "s"}}]}
    script = {"turns": [write, {"text": "Not written."}]}
    out = keel_run(store, repo, script, "--allow-writes", "--approval-timeout", "0.5")
    assert out["status"] == "awaiting_approval"
    run_id = str(out["run_id"])
    page = ui.get(f"/runs/{run_id}").text
    time.sleep(0.8)
    late = ui.post(f"/runs/{run_id}/calls/{CALL}/approve", data={"csrf": csrf(page), "by": "ana"})
    assert late.status_code == 409 and "approval timeout" in late.text
    wait_for_status(store, run_id, "completed")  # it went on as after a denial
    assert not (repo / "S.md").exists()
