"""Keel through LiteLLM's proxy in front of llama-cpp-python's server (issue 23, ADR 0035).

LiteLLM is installed from PyPI into its own virtual environment, once per machine in the test
cache (tests/side_installs.py; pinned below), never into ``.venv``: its pins would move openai,
httpx and pydantic under Keel. If pip cannot install it (a registry outage), the tests skip
with pip's error.

The proxy routes the model name to the upstream with LiteLLM's ``hosted_vllm/`` provider (an
OpenAI-compatible server), which is what a user of a local server configures. What each of
Keel's routes does through it:

- ``openai-chat:`` (``/v1/chat/completions``): a full run; the approved call and its result
  are replayed through the proxy and the synthesis turn answers.
- ``openai:`` (``/v1/responses``): the proxy forwards the Responses API to the upstream's
  ``/v1/responses``, which llama-cpp-python lacks: its 404, which Keel fails with at once.
- ``anthropic:`` (``/v1/messages``): the proxy translates to chat completions, with the system
  prompt as a list of blocks, which llama-cpp-python refuses (``Input should be a valid
  string``): the proxy's 500, retried, then Keel fails with it.

Both failures are the defect the issue reported (an error answered by the proxy recorded as an
empty turn, its message nowhere): here they are ``ModelError`` with the proxy's own message.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

import keel
from keel.records import ModelErrorSeen
from keel.transports.anthropic import AnthropicTransport
from keel.transports.openai_chat import OpenAIChatTransport
from keel.transports.openai_responses import OpenAIResponsesTransport
from local_model import _free_port
from side_installs import install_venv, private_venv
from support import call

pytest_plugins = ["local_model"]

LITELLM = "litellm[proxy]==1.108.7"
"""The version these tests were written against (ADR 0035)."""
PROXY_START_TIMEOUT = 120.0
MODEL = "qwen"
PORT_NOTE = "The widget listens on port 8421 by default; set WIDGET_PORT to change it.\n"


@pytest.fixture(scope="session")
def litellm_bin(pytestconfig: pytest.Config) -> Path:
    """The bin folder of LiteLLM's venv (made once per machine: 63 to 92 s cold, 118 packages)."""
    return private_venv(pytestconfig, "litellm", (LITELLM,)).parent


def test_a_registry_outage_skips_with_pips_error(tmp_path: Path) -> None:
    """No index to reach (a closed loopback port, no config files): the reason to skip is
    pip's own error, so CI says why the LiteLLM tests did not run instead of failing."""
    closed = f"http://127.0.0.1:{_free_port()}/simple"
    env = os.environ | {
        "PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": closed, "PIP_RETRIES": "0",
        "PIP_TIMEOUT": "2", "PIP_NO_CACHE_DIR": "1",
    }  # fmt: skip
    env.pop("PIP_FIND_LINKS", None)
    env.pop("PIP_EXTRA_INDEX_URL", None)
    reason = install_venv(tmp_path / "venv", (LITELLM,), env)
    assert reason is not None
    assert reason.startswith(f"pip could not install {LITELLM}: "), reason
    assert "No matching distribution found for litellm" in reason, reason


@dataclass(frozen=True)
class Proxy:
    url: str
    key: str


@pytest.fixture(scope="module")
def litellm_proxy(litellm_bin: Path, function_server: str) -> Iterator[Proxy]:
    """The proxy on a free loopback port with a throwaway master key, routing ``qwen`` to the
    llama-cpp-python server; stopped after the module."""
    key = f"sk-{secrets.token_hex(16)}"
    port = _free_port()
    with tempfile.TemporaryDirectory() as home:
        config = Path(home) / "litellm.yaml"
        config.write_text(
            "model_list:\n"
            f"  - model_name: {MODEL}\n"
            "    litellm_params:\n"
            f"      model: hosted_vllm/{MODEL}\n"
            f"      api_base: {function_server}\n"
            "      api_key: none\n"
            # Keel retries; without cooldowns every attempt reaches the upstream (a cooled-down
            # deployment is answered 429 by the proxy itself)
            "router_settings:\n"
            "  num_retries: 0\n"
            "  disable_cooldowns: true\n"
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_", "LITELLM"))}
        # the price map bundled with the package, not fetched from GitHub at start
        env |= {"LITELLM_MASTER_KEY": key, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
        command = [str(litellm_bin / "litellm"), "--config", str(config), "--host", "127.0.0.1"]
        with (Path(home) / "proxy.log").open("w+b") as log:
            process = subprocess.Popen(
                [*command, "--port", str(port)], cwd=home, env=env, stdout=log,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
            try:
                url = f"http://127.0.0.1:{port}"
                wait_for(url, process, log)
                yield Proxy(url, key)
            finally:
                process.terminate()
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


def wait_for(url: str, process: subprocess.Popen[bytes], log: object) -> None:
    deadline = time.monotonic() + PROXY_START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"litellm exited with {process.returncode}:\n{tail(log)}")
        try:
            if httpx.get(f"{url}/health/liveliness", timeout=2.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    pytest.fail(f"litellm did not answer within {PROXY_START_TIMEOUT:.0f} s:\n{tail(log)}")


def tail(log: object) -> str:
    assert hasattr(log, "seek") and hasattr(log, "read")
    log.seek(0)
    text: str = log.read().decode(errors="replace")
    return text[-3000:]


def tools_in(tmp_path: Path) -> tuple[Path, list[keel.Tool]]:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "notes.md").write_text(PORT_NOTE)
    return repo, [*keel.file_tools(repo), *keel.write_tools(repo)]


def test_openai_chat_runs_to_its_answer_through_litellm_proxy(
    litellm_proxy: Proxy, tmp_path: Path
) -> None:
    """The call turn (a write, paused for approval) comes from a script, as in
    `test_compat_servers.py`; approved, the run resumes through the proxy, which must carry the
    replayed call, its result and the synthesis turn to the upstream and its answer back."""
    repo, tools = tools_in(tmp_path)
    store = keel.Store(tmp_path / "runs.sqlite")
    limits = keel.Limits(max_model_calls=2, deadline=120)
    script = keel.ScriptedTransport.from_dict(
        {"turns": [call("write_file", path="answer.md", content="port 8421")]}
    )
    paused = keel.Agent(script, tools=tools, store=store, limits=limits).run(
        "Which port does the widget use? Note it in answer.md."
    )
    assert paused.status == "awaiting_approval"
    chat = OpenAIChatTransport(
        MODEL, base_url=f"{litellm_proxy.url}/v1", api_key=litellm_proxy.key, max_tokens=48,
        tool_choice="auto",
    )  # fmt: skip
    agent = keel.Agent(chat, tools=tools, store=store, limits=limits)
    agent.approve(paused.run_id, paused.pending_approvals[0].call_id, by="test")
    done = agent.resume(paused.run_id)
    errors = [e for e in store.events(done.run_id) if isinstance(e, ModelErrorSeen)]
    store.close()
    assert done.status == "completed", done.failure
    assert done.synthesized == "budget" and done.answer
    assert (repo / "answer.md").read_text() == "port 8421"
    assert errors == []  # accepted at once, no retry


@pytest.mark.parametrize(
    ("route", "status", "says"),
    [
        ("openai", 404, ["litellm.NotFoundError", "Hosted_vllmException", "model group 'qwen'"]),
        (
            "anthropic",
            500,
            [
                "litellm.InternalServerError",
                "Hosted_vllmException",
                "Input should be a valid string",
            ],
        ),
    ],
)
def test_a_route_the_upstream_lacks_fails_with_the_proxys_own_error(
    litellm_proxy: Proxy, tmp_path: Path, route: str, status: int, says: list[str]
) -> None:
    """Through the proxy the upstream cannot answer these (see the module docstring): the run
    fails ``ModelError`` with the status and the message the proxy sent, never an empty turn."""
    _, tools = tools_in(tmp_path)
    store = keel.Store(tmp_path / "runs.sqlite")
    transport: keel.Transport
    if route == "openai":
        transport = OpenAIResponsesTransport(
            MODEL, base_url=f"{litellm_proxy.url}/v1", api_key=litellm_proxy.key,
            max_output_tokens=48,
        )  # fmt: skip
    else:
        transport = AnthropicTransport(
            MODEL, base_url=litellm_proxy.url, api_key=litellm_proxy.key, max_tokens=48
        )
    limits = keel.Limits(max_model_calls=8, deadline=120)
    done = keel.Agent(transport, tools=tools, store=store, limits=limits).run(
        "Which port does the widget use?"
    )
    errors = [e for e in store.events(done.run_id) if isinstance(e, ModelErrorSeen)]
    store.close()
    assert done.status == "failed" and done.failure is not None
    assert done.failure.kind == "ModelError", done.failure
    assert done.failure.details["status"] == status
    for words in says:
        assert words in done.failure.message, done.failure.message
    assert errors and all(e.status == status and says[0] in e.message for e in errors)
