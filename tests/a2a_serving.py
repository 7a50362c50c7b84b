"""Helpers for the `keel serve` A2A tests: scripted models, real `keel serve` processes on
loopback, the official `a2a-sdk` client (ADR 0040), and a venv of its own for another client
(fasta2a, ADK), so its pins cannot move Keel's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from a2a.client import Client, ClientConfig, create_client
from a2a.helpers.proto_helpers import get_data_parts, new_data_part
from a2a.types import (
    Message,
    Part,
    Role,
    SendMessageRequest,
    StreamResponse,
    TaskState,
)

from keel.store import RunRecord, Store

SRC = str(Path(__file__).resolve().parents[1] / "src")
ANSWER = {"turns": [{"text": "The loop imports the breaker."}]}
WRITE = {
    "turns": [
        {
            "tool_calls": [
                {
                    "name": "write_file",
                    "arguments": {"content": "hello\n", "path": "out.txt", "append": True},
                }
            ]
        },
        {"text": "Wrote out.txt."},
    ]
}
STEPS = {
    "turns": [
        *(
            {"tool_calls": [{"name": "list_files", "arguments": {"path": f"d{i}"}}]}
            for i in range(4)
        ),
        {"text": "Done listing."},
    ],
    "latency_ms": 250,
}
FAILS = {"turns": [{"error": {"status": 400, "message": "the request is malformed"}}]}


Spec = tuple[dict[str, Any], tuple[str, ...]]
"""A server's script and its extra options."""


def launch(tmp: Path, spec: Spec, name: str, store: Path) -> subprocess.Popen[str]:
    script, extra = spec
    path = tmp / f"{name}.json"
    path.write_text(json.dumps(script))
    (tmp / "repo").mkdir(exist_ok=True)
    args = [
        *(sys.executable, "-m", "keel", "serve", "--port", "0", "--model", f"script:{path}"),
        *("--store", str(store), "--repo", str(tmp / "repo"), *extra),
    ]
    env = {**os.environ, "PYTHONPATH": SRC, "HOME": str(tmp)}
    env.pop("KEEL_SERVE_TOKEN", None)
    return subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def stop(processes: list[subprocess.Popen[str]]) -> None:
    """SIGTERM to each at once, then wait for each (SIGKILL after 10 s)."""
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()


@contextmanager
def keel_servers(
    tmp: Path, specs: dict[str, Spec], store: Path | str | None = None
) -> Iterator[dict[str, tuple[str, subprocess.Popen[str]]]]:
    """`keel serve`s on free loopback ports, started at once (one store); by name: the URL
    and the process of each."""
    processes = {
        name: launch(tmp, spec, name, store or tmp / "runs.db") for name, spec in specs.items()
    }
    try:
        served = {}
        for name, process in processes.items():
            assert process.stdout is not None and process.stderr is not None
            url = process.stdout.readline().strip()
            assert url.startswith("http://127.0.0.1:"), process.stderr.read()
            served[name] = (url, process)
        yield served
    finally:
        stop(list(processes.values()))


@contextmanager
def keel_serve(
    tmp: Path, script: dict[str, Any], *extra: str, name: str = "s", store: Path | None = None
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """One `keel serve` on a free loopback port; yields its URL and process."""
    with keel_servers(tmp, {name: (script, extra)}, store) as served:
        yield served[name]


@dataclass(frozen=True)
class Served:
    url: str
    tmp: Path

    @property
    def store(self) -> Path:
        return self.tmp / "runs.db"


@asynccontextmanager
async def a2a(
    url: str, *, token: str | None = None, binding: str = "JSONRPC"
) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    http = httpx.AsyncClient(headers=headers, timeout=30)
    config = ClientConfig(httpx_client=http, supported_protocol_bindings=[binding])
    client = await create_client(url, client_config=config)
    try:
        yield client
    finally:
        await client.close()
        await http.aclose()


def question(text: str, **fields: Any) -> SendMessageRequest:
    message = Message(
        message_id=uuid.uuid4().hex, role=Role.ROLE_USER, parts=[Part(text=text)], **fields
    )
    return SendMessageRequest(message=message)


def decisions(task_id: str, *items: dict[str, Any]) -> SendMessageRequest:
    message = Message(
        message_id=uuid.uuid4().hex,
        role=Role.ROLE_USER,
        task_id=task_id,
        parts=[new_data_part({"keel_decisions": list(items)})],
    )
    return SendMessageRequest(message=message)


async def collect(stream: AsyncIterator[StreamResponse]) -> list[StreamResponse]:
    return [event async for event in stream]


def final_state(events: list[StreamResponse]) -> int:
    last = events[-1]
    return (
        last.status_update.status.state
        if last.HasField("status_update")
        else last.task.status.state
    )


def task_id_of(events: list[StreamResponse]) -> str:
    return events[0].task.id


def seq_of(event: StreamResponse) -> int | None:
    if not event.HasField("status_update") or "keel_seq" not in event.status_update.metadata:
        return None
    return int(event.status_update.metadata["keel_seq"])


def runs_in(store: Path) -> list[RunRecord]:
    """The runs recorded, read from the store itself."""
    if not store.exists():
        return []
    db = Store(store, read_only=True)
    try:
        return db.list_runs(100)
    finally:
        db.close()


async def paused(client: Client) -> tuple[str, dict[str, Any]]:
    """A new task on the write server, streamed to input-required: its id and pending call."""
    events = await collect(client.send_message(question("Write it.")))
    assert final_state(events) == TaskState.TASK_STATE_INPUT_REQUIRED
    status = events[-1].status_update.status
    [pending] = [d["keel_pending"] for d in get_data_parts(status.message.parts)]
    [call] = pending
    return task_id_of(events), call
