"""`keel ui`'s live page shows the answer growing while another process's model writes it
(ADR 0039): through a side file beside the store, never the store itself."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
from starlette.testclient import TestClient

import keel
from keel.errors import ProviderError
from keel.live_file import MAX_BYTES, LiveFiles, live_dir, wanted
from keel.messages import ModelRequest, ModelResponse
from keel.records import ModelResponseReceived
from keel.store import Store
from keel.transports.scripted import ScriptedTransport
from keel.transports.streaming import OnText, TextDelta, TextDiscarded
from keel.ui.app import create_app
from keel.ui.live_text import HEAD_BYTES, STALE_SECONDS, read
from keel.ui.security import served_hosts

SRC = str(Path(__file__).resolve().parents[1] / "src")
ENV = {**os.environ, "PYTHONPATH": SRC}


def start(args: list[str], cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "keel", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        env={**ENV, "HOME": str(cwd)},
    )


def live_texts(lines: Iterator[str]) -> list[str]:
    """The `text` messages of a page's event stream, read as the browser reads them, up to its
    `end`."""
    texts: list[str] = []
    kind = ""
    for line in lines:
        if line.startswith("event: "):
            kind = line[7:]
        elif line.startswith("data: ") and kind == "text":
            texts.append(json.loads(line[6:])["html"])
        elif kind == "end":
            break
    return texts


def running_run(store: Path, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if store.exists():
            runs = Store(store, read_only=True).list_runs(5)
            if runs:
                return runs[0].run_id
        time.sleep(0.05)
    raise AssertionError("no run started")


def test_the_live_page_shows_the_answer_growing_from_another_process_escaped(
    tmp_path: Path,
) -> None:
    store = tmp_path / "runs.sqlite"
    words = " ".join(["<b>x</b>"] + [f"w{i}" for i in range(12)])
    model = tmp_path / "model.json"
    model.write_text(json.dumps({"turns": [{"text": words}], "stream_ms": 150}))
    Store(store).close()
    ui = start(["ui", "--store", str(store), "--port", "0"], tmp_path)
    run = None
    try:
        assert ui.stdout is not None
        url = ui.stdout.readline().strip()
        assert live_dir(store).is_dir()  # `keel ui` asks for live text on this store
        run = start(["run", "Q", "--model", f"script:{model}", "--store", str(store)], tmp_path)
        run_id = running_run(store)
        with httpx.stream("GET", f"{url}runs/{run_id}/live", timeout=30) as stream:
            texts = live_texts(stream.iter_lines())
        growing = [t for t in texts if t]
        assert len(growing) >= 2 and len(growing[0]) < len(growing[-1])  # it grew
        assert "&lt;b&gt;x&lt;/b&gt;" in growing[0] and "<b>" not in "".join(texts)
        assert texts[-1] == ""  # the answer recorded: the page drops the growing text
        assert run.wait(30) == 0
        assert Store(store, read_only=True).get_run(run_id).status == "completed"  # type: ignore[union-attr]
        assert list(live_dir(store).iterdir()) == []  # nothing left behind
        events = Store(store, read_only=True).events(run_id)
        assert [e.text for e in events if isinstance(e, ModelResponseReceived)] == [words]
    finally:
        for process in (ui, run):
            if process is not None and process.poll() is None:
                process.terminate()
                process.wait(10)
    assert not live_dir(store).exists()  # `keel ui` stopped: runs from now on stream nothing


def test_a_crashed_processs_stale_live_file_is_not_shown(tmp_path: Path) -> None:
    file = LiveFiles(tmp_path).for_run("r1")
    file(TextDelta("half an answer", 2, 1))
    assert read(file.path) == (2, 1, "half an answer")
    old = time.time() - STALE_SECONDS - 5
    os.utime(file.path, (old, old))
    assert read(file.path) is None


def test_the_live_text_kept_is_capped(tmp_path: Path) -> None:
    file = LiveFiles(tmp_path).for_run("r1")
    for _ in range(MAX_BYTES // 1000 + 5):
        file(TextDelta("x" * 1000, 1, 1))
    found = read(file.path)
    assert found is not None and len(found[2]) == MAX_BYTES
    assert file.path.stat().st_size <= MAX_BYTES + HEAD_BYTES


async def test_a_discarded_attempts_live_text_disappears(tmp_path: Path) -> None:
    directory = tmp_path / "runs.sqlite.live"
    directory.mkdir(mode=0o700)  # as `keel ui` makes it: others' folders are not written in
    file = LiveFiles(directory).for_run("r/1")
    file(TextDelta("partial", 1, 1))
    assert file.path.parent == directory and file.path.read_bytes().endswith(b"partial")
    file(TextDiscarded(1, 1))
    assert not file.path.exists()
    file(TextDelta("again", 1, 2))
    assert file.path.read_bytes() == b'{"step": 1, "attempt": 2}\nagain'


async def test_no_live_file_when_no_one_streams(tmp_path: Path) -> None:
    """No `keel ui` asked (no directory): the command line adds no listener; a run with the
    listener but a model that does not stream writes nothing."""
    store = tmp_path / "runs.sqlite"
    assert wanted(store) is None and wanted("postgresql://x/y") is None
    live_dir(store).mkdir(mode=0o700)
    quiet = ScriptedTransport.from_dict({"turns": [{"text": "one two"}]})
    agent = keel.Agent(quiet, store=store, text_listeners=[LiveFiles(live_dir(store))])
    result = await agent.arun("Q")
    assert result.answer == "one two" and list(live_dir(store).iterdir()) == []


class CutOnce:
    """A model whose first attempt streams a few words and is cut, the retry streams its
    answer (what a dropped stream does to a provider's transport)."""

    name = "cut-once"
    streams = True

    def __init__(self) -> None:
        self.attempts = 0

    async def request(self, request: ModelRequest) -> ModelResponse:
        raise AssertionError("a run with a text listener streams")

    async def request_streaming(self, request: ModelRequest, on_text: OnText) -> ModelResponse:
        self.attempts += 1
        if self.attempts == 1:
            on_text("wrong <i>start</i>")
            await asyncio.sleep(0.6)
            raise ProviderError("cut-once: the stream was cut", retryable=True)
        await asyncio.sleep(0.6)
        on_text("right answer")
        await asyncio.sleep(0.6)
        return ModelResponse(text="right answer", stop_reason="stop")


def test_a_discarded_attempts_text_disappears_from_the_live_page(tmp_path: Path) -> None:
    store = tmp_path / "runs.sqlite"
    Store(store).close()
    app = create_app(store, served_hosts("127.0.0.1", 8350))
    app.state.ui.poll = 0.05
    with TestClient(app, base_url="http://127.0.0.1:8350") as client:
        agent = keel.Agent(CutOnce(), store=store, text_listeners=[LiveFiles(live_dir(store))])
        done: list[keel.RunResult] = []
        runner = threading.Thread(target=lambda: done.append(agent.run("Q")))
        runner.start()
        run_id = running_run(store)
        with client.stream("GET", f"/runs/{run_id}/live") as stream:
            texts = live_texts(stream.iter_lines())
        runner.join(30)
    assert done and done[0].answer == "right answer"
    wrong = next(i for i, t in enumerate(texts) if "wrong" in t)
    assert "&lt;i&gt;start&lt;/i&gt;" in texts[wrong]
    right = next(i for i, t in enumerate(texts) if "right answer" in t)
    assert "" in texts[wrong:right]  # the discarded attempt's text was dropped
    assert not any("wrong" in t for t in texts[right:])
    assert not live_dir(store).exists()  # left empty, so removed when the view stopped
