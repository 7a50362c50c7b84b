"""Each run of an Agent built from a model spec gets its own transport state: an Agent on a
``script:`` spec can run twice, or two questions at once, each from the script's start, and a
resumed run still continues at its own position. Stateless transports are shared."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import keel
from keel.messages import ModelRequest, ModelResponse
from keel.transports.base import PinnedSampling


def script_file(tmp_path: Path) -> Path:
    (tmp_path / "notes.txt").write_text("The loop checkpoints every step.\n")
    script = {
        "turns": [
            {"tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}]},
            {"text": "It checkpoints every step."},
        ]
    }
    path = tmp_path / "script.json"
    path.write_text(json.dumps(script))
    return path


def test_an_agent_on_a_script_spec_runs_twice(tmp_path: Path) -> None:
    spec = f"script:{script_file(tmp_path)}"
    with keel.Agent(spec, tools=keel.file_tools(tmp_path), store=tmp_path / "r.db") as agent:
        first = agent.run("What does the loop do?")
        second = agent.run("What does the loop do?")
    assert (first.status, second.status) == ("completed", "completed"), second.failure
    assert first.answer == second.answer == "It checkpoints every step."
    assert first.tool_calls == second.tool_calls == 1


async def test_an_agent_on_a_script_spec_runs_two_questions_at_once(tmp_path: Path) -> None:
    spec = f"script:{script_file(tmp_path)}"
    with keel.Agent(spec, tools=keel.file_tools(tmp_path), store=tmp_path / "r.db") as agent:
        results = await asyncio.gather(agent.arun("one?"), agent.arun("two?"))
    assert [r.status for r in results] == ["completed", "completed"], results
    assert [r.model_calls for r in results] == [2, 2]


class Stateless:
    """A transport with no per-run position, and pinned sampling."""

    name = "stateless"

    def __init__(self) -> None:
        self.requests = 0
        self.sampling = {"temperature": 0.0, "seed": 7}

    async def request(self, request: ModelRequest) -> ModelResponse:
        self.requests += 1
        return ModelResponse("answer")


def test_a_transport_instance_is_shared_and_its_sampling_recorded(tmp_path: Path) -> None:
    transport = Stateless()
    assert isinstance(transport, PinnedSampling)
    with keel.Agent(transport, store=tmp_path / "r.db") as agent:
        runs = [agent.run("q1"), agent.run("q2")]
        record = agent.store.get_run(runs[0].run_id)
    assert transport.requests == 2
    assert record is not None
    assert record.config.settings["sampling"] == {"temperature": 0.0, "seed": 7}
