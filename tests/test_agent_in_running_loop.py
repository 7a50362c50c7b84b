"""The blocking facade (`run`, `ask`, `resume`) inside a running event loop (an async web
endpoint, a Jupyter cell) is a ConfigError naming the awaitable to use, not asyncio's bare
RuntimeError, and it starts no run."""

from __future__ import annotations

from pathlib import Path

import pytest

import keel
from keel.errors import ConfigError


def script(tmp_path: Path) -> str:
    path = tmp_path / "script.json"
    path.write_text('{"turns": [{"text": "done"}]}')
    return f"script:{path}"


async def test_agent_run_inside_a_running_loop_names_await_agent_arun(tmp_path: Path) -> None:
    with keel.Agent(script(tmp_path), store=tmp_path / "r.db") as agent:
        with pytest.raises(ConfigError, match=r"await agent\.arun\(\.\.\.\)"):
            agent.run("What does the loop do?")
        assert agent.store.count_runs() == 0


async def test_agent_ask_and_resume_inside_a_running_loop_name_their_awaitables(
    tmp_path: Path,
) -> None:
    with keel.Agent(script(tmp_path), store=tmp_path / "r.db") as agent:
        with pytest.raises(ConfigError, match=r"await agent\.aask\(\.\.\.\)"):
            agent.ask("run-1", "and then?")
        with pytest.raises(ConfigError, match=r"await agent\.aresume\(\.\.\.\)"):
            agent.resume("run-1")
