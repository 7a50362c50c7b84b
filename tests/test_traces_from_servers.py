"""Traces from servers and workers (ADR 0065): `keel serve --otel` and `keel worker --otel`
export their runs' spans as `keel run --otel` does (OTLP/HTTP, or the console), received here
by a loopback collector that decodes what the real OpenTelemetry SDK sends; and a tree's child
spans are named after their agent (`invoke_agent reader`), not all `keel`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import keel
from otlp_collector import Collector, ReceivedSpan

SRC = str(Path(__file__).resolve().parents[1] / "src")
ANSWER = "The notes say leases expire."


def _env(tmp_path: Path, collector: Collector) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "KEEL_"))}
    return env | {
        "PYTHONPATH": SRC,
        "HOME": str(tmp_path),
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "20",
    }


def _runs(spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
    return [s for s in spans if s.name.startswith("invoke_agent")]


def test_a_childs_invoke_agent_span_is_named_after_its_agent(tmp_path: Path, spans: Any) -> None:
    (tmp_path / "a.md").write_text("A.\n")
    child_turns = [{"tool_calls": [{"name": "read_file", "arguments": {"path": "a.md"}}]},
                   {"text": "A."}]  # fmt: skip
    reader = keel.Agent(
        keel.ScriptedTransport.from_dict({"turns": child_turns}),
        tools=keel.file_tools(tmp_path),
        store=tmp_path / "runs.sqlite",  # not the user's default store, which may be anything
    )
    lead_turns = [{"tool_calls": [{"name": "reader", "arguments": {"task": "read a.md"}}]},
                  {"text": "A."}]  # fmt: skip
    lead = keel.Agent(
        keel.ScriptedTransport.from_dict({"turns": lead_turns}),
        tools=[reader.as_tool("reader", "Reads")],
        store=tmp_path / "runs.sqlite",
    )
    with lead:
        assert lead.run("q").status == "completed"
    runs = {
        s.name: s for s in spans.get_finished_spans() if s.name.startswith("invoke_agent")
    }
    assert set(runs) == {"invoke_agent keel", "invoke_agent reader"}
    assert runs["invoke_agent reader"].attributes["gen_ai.agent.name"] == "reader"
    assert runs["invoke_agent keel"].attributes["gen_ai.agent.name"] == "keel"
    assert runs["invoke_agent reader"].parent is not None


@pytest.fixture
def collector() -> Iterator[Collector]:
    with Collector() as received:
        yield received


def _stop(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def test_keel_serve_otel_exports_the_served_runs_spans(
    tmp_path: Path, collector: Collector
) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": [{"text": ANSWER}]}))
    (tmp_path / "repo").mkdir()
    args = [sys.executable, "-m", "keel", "serve", "--port", "0", "--model", f"script:{script}",
            "--store", str(tmp_path / "runs.db"), "--repo", str(tmp_path / "repo"),
            "--otel"]  # fmt: skip
    process = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=_env(tmp_path, collector),
    )  # fmt: skip
    try:
        assert process.stdout is not None and process.stderr is not None
        url = process.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), process.stderr.read()
        body = {"threadId": "t1", "runId": "r1", "messages": [
            {"id": "m1", "role": "user", "content": "What do the notes say?"}]}  # fmt: skip
        answered = httpx.post(f"{url}/ag-ui", json=body, timeout=60)
        assert answered.status_code == 200 and "RUN_FINISHED" in answered.text
    finally:
        _stop(process)
        for pipe in (process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()
    runs = _runs(collector.spans)
    assert [s.name for s in runs] == ["invoke_agent keel"], [s.name for s in collector.spans]
    assert runs[0].attributes["keel.status"] == "completed"
    assert any(s.name.startswith("chat ") for s in collector.spans)


def test_keel_worker_otel_exports_the_runs_it_advances(
    tmp_path: Path, collector: Collector, pg_url: str
) -> None:
    from pool import KEEL

    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": [{"text": ANSWER}]}))
    env = _env(tmp_path, collector)
    submitted = subprocess.run(
        [*KEEL, "submit", "What do the notes say?", "--model", f"script:{script}", "--store",
         pg_url, "--repo", str(tmp_path), "--json"],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    run_id = json.loads(submitted.stdout)["run_id"]
    log = (tmp_path / "worker.log").open("w")
    worker = subprocess.Popen(
        [*KEEL, "worker", "--store", pg_url, "--name", "w1", "--otel"],
        stdout=log, stderr=log, text=True, env=env,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not any(s.attributes.get("keel.run_id") == run_id for s in _runs(collector.spans)):
            assert worker.poll() is None, (tmp_path / "worker.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "worker.log").read_text()
            time.sleep(0.1)
    finally:
        _stop(worker)
        log.close()
    (run,) = [s for s in _runs(collector.spans) if s.attributes.get("keel.run_id") == run_id]
    assert run.name == "invoke_agent keel" and run.attributes["keel.status"] == "completed"
