"""Budgets (ADR 0005): every attempt sent to a provider counts against the model-call budget,
also when the process dies before the response is saved. The attempt is journaled before it is
sent; checked with real `keel` processes that SIGKILL themselves after each response, against
an OpenAI-compatible server on loopback that counts what it receives."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from loopback_http import QuietHandler, serving

TOOL_CALL_COMPLETION = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "m",
    "choices": [
        {
            "index": 0,
            "finish_reason": "tool_calls",
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "list_files", "arguments": "{}"},
                    }
                ],
            },
        }
    ],
    "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12},
}


class CountingServer(ThreadingHTTPServer):
    hits = 0

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client that killed itself mid-connection is the point of the test


class Handler(QuietHandler):
    server: CountingServer

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.server.hits += 1
        self.reply(json.dumps(TOOL_CALL_COMPLETION).encode())


@pytest.fixture
def server() -> Iterator[CountingServer]:
    with serving(CountingServer(("127.0.0.1", 0), Handler)) as httpd:
        yield httpd


def keel(tmp_path: Path, *args: str, crash: bool = True) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI", "KEEL"))}
    if crash:
        env["KEEL_FAILPOINTS"] = "after_model_response:1"
    return subprocess.run(
        [sys.executable, "-m", "keel", *args, "--store", str(tmp_path / "runs.sqlite")],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_model_attempts_lost_in_a_crash_still_count_against_the_budget(
    tmp_path: Path, server: CountingServer
) -> None:
    base = f"http://127.0.0.1:{server.server_address[1]}/v1"
    first = keel(
        tmp_path,
        "run", "What is here?", "--model", "openai-chat:m", "--base-url", base,
        "--max-model-calls", "2", "--repo", str(tmp_path), "--json",
    )  # fmt: skip
    assert first.returncode < 0, first.stderr  # killed itself after the response
    run_id = keel(tmp_path, "runs", crash=False).stdout.splitlines()[1].split()[0]
    for _ in range(3):
        resumed = keel(tmp_path, "resume", run_id, "--json")
        if resumed.returncode >= 0:
            break
    assert server.hits <= 2, f"{server.hits} requests were sent under a budget of 2"
    result = json.loads(resumed.stdout)
    assert result["status"] == "failed" and result["failure"]["kind"] == "BudgetExhausted"
    assert result["model_calls"] == 2
