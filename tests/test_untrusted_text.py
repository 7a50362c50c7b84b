"""Strings Keel could not store (tracker issue 20), written as the attacks: a lone UTF-16
surrogate in a model's answer, its arguments, a tool name, a call id, a tool's result, a file
name or a provider's error message. Before keel.inbound each one raised UnicodeEncodeError out
of the run (the response lost, the run left `running`); now each is replaced by U+FFFD where it
enters, on SQLite and on Postgres, and the run ends as the rules say."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

import keel
from keel.cli.app import app
from keel.errors import ProviderError
from keel.messages import ModelRequest, ModelResponse, ToolCall
from keel.records import (
    Event,
    ModelErrorSeen,
    ModelResponseReceived,
    ToolCallRequested,
    ToolResultRecorded,
)
from keel.store import open_store

pytest_plugins = ["postgres"]

LONE = "\ud800"
SHOWN = "\ufffd"


class Hostile:
    """A model whose turns are given as responses, so any string can be in them."""

    name = "hostile"

    def __init__(self, *turns: ModelResponse | ProviderError) -> None:
        self.turns = list(turns)

    async def request(self, request: ModelRequest) -> ModelResponse:
        turn = self.turns.pop(0) if self.turns else ModelResponse("done")
        if isinstance(turn, ProviderError):
            raise turn
        return turn


def _store(target: str | Path) -> keel.RunStore:
    return open_store(str(target))


async def _run(target: str | Path, model: Hostile, tools: list[keel.Tool]) -> keel.RunResult:
    store = _store(target)
    agent = keel.Agent(model, tools=tools, store=store, limits=keel.Limits(retry_base_delay=0.001))
    try:
        return await agent.arun("What is there?")
    finally:
        store.close()


def _events(target: str | Path, run_id: str) -> list[Event]:
    store = _store(target)
    try:
        return store.events(run_id)
    finally:
        store.close()


async def test_a_lone_surrogate_in_the_answer_is_stored_as_the_replacement_character(
    store_target: str | Path,
) -> None:
    result = await _run(store_target, Hostile(ModelResponse(f"half a pair: {LONE}!")), [])
    assert result.status == "completed"
    assert result.answer == f"half a pair: {SHOWN}!"
    store = _store(store_target)
    try:
        record = store.get_run(result.run_id)
        assert record is not None and record.state.answer == result.answer
    finally:
        store.close()


async def test_lone_surrogates_in_tool_names_call_ids_and_arguments_are_answered(
    store_target: str | Path, tmp_path: Path
) -> None:
    escaped = ToolCall.from_raw(f"call{LONE}", "read_file", '{"path": "notes\\ud800.md"}')
    named = ToolCall.from_arguments("call_2", f"read{LONE}file", {"path": "notes.md"})
    (tmp_path / "notes.md").write_text("notes\n")
    model = Hostile(ModelResponse(None, (escaped, named)), ModelResponse("answered"))
    result = await _run(store_target, model, keel.file_tools(tmp_path))
    assert result.status == "completed" and result.tool_calls == 2  # both answered
    events = _events(store_target, result.run_id)
    requested = [e for e in events if isinstance(e, ToolCallRequested)]
    (response,) = [e for e in events if isinstance(e, ModelResponseReceived) and e.tool_calls]
    assert response.tool_calls[0].provider_id == f"call{SHOWN}"  # kept for the wire
    assert requested[0].arguments == {"path": f"notes{SHOWN}.md"}
    assert requested[1].name == f"read{SHOWN}file"
    results = [e for e in events if isinstance(e, ToolResultRecorded)]
    assert len(results) == 2 and all(r.is_error for r in results)


async def test_a_lone_surrogate_in_a_tool_result_is_stored(store_target: str | Path) -> None:
    @keel.tool
    def lookup(term: str) -> str:
        """Look a term up."""
        return f"{term}: {LONE} and \udcff"

    call = ToolCall.from_arguments("c1", "lookup", {"term": "lease"})
    result = await _run(store_target, Hostile(ModelResponse(None, (call,))), [lookup])
    assert result.status == "completed"
    events = _events(store_target, result.run_id)
    (recorded,) = [e for e in events if isinstance(e, ToolResultRecorded)]
    assert recorded.content == f"lease: {SHOWN} and {SHOWN}"


@pytest.mark.skipif(os.uname().sysname != "Linux", reason="file names as raw bytes")
async def test_a_file_name_that_is_not_utf8_is_listed_with_the_replacement_character(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "notes.md").write_text("ok\n")
    with open(os.path.join(os.fsencode(repo), b"bad\xff.txt"), "wb") as handle:
        handle.write(b"x")
    call = ToolCall.from_arguments("c1", "list_files", {"path": "."})
    model = Hostile(ModelResponse(None, (call,)))
    result = await _run(tmp_path / "runs.sqlite", model, keel.file_tools(repo))
    assert result.status == "completed"
    events = _events(tmp_path / "runs.sqlite", result.run_id)
    (listing,) = [e for e in events if isinstance(e, ToolResultRecorded)]
    assert f"bad{SHOWN}.txt" in listing.content and "notes.md" in listing.content


async def test_a_lone_surrogate_in_a_provider_error_is_a_model_error_that_can_be_stored(
    store_target: str | Path,
) -> None:
    model = Hostile(ProviderError(f"invalid request {LONE}", status=400, retryable=False))
    result = await _run(store_target, model, [])
    assert result.status == "failed" and result.failure is not None
    assert result.failure.kind == "ModelError" and SHOWN in result.failure.message
    seen = [e for e in _events(store_target, result.run_id) if isinstance(e, ModelErrorSeen)]
    assert seen and SHOWN in seen[0].message


async def test_keel_show_json_of_such_a_run_is_valid_json(tmp_path: Path) -> None:
    db = tmp_path / "runs.sqlite"
    result = await _run(db, Hostile(ModelResponse(f"x{LONE}")), [])
    shown = CliRunner().invoke(app, ["show", result.run_id, "--json", "--store", str(db)])
    assert shown.exit_code == 0
    assert json.loads(shown.stdout)["run"]["answer"] == f"x{SHOWN}"


async def test_any_error_of_the_store_during_a_step_is_a_classified_failure(
    store_target: str | Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Data a driver cannot take (here: the answer's JSON encoder failing as an encode error
    would) ends the process's run as StoreUnavailable, never a traceback out of `agent.run`."""
    import keel.store.postgres_store as pg
    import keel.store.sqlite_store as lite

    def refuse(value: object) -> str:
        if "poison" in str(value):
            raise UnicodeEncodeError("utf-8", "poison", 0, 1, "surrogates not allowed")
        return original(value)

    module = lite if isinstance(store_target, Path) else pg
    original = module._dumps
    monkeypatch.setattr(module, "_dumps", refuse)
    result = await _run(store_target, Hostile(ModelResponse("poison")), [])
    assert result.status == "failed" and result.failure is not None
    assert result.failure.kind == "StoreUnavailable"
    assert "surrogates not allowed" in result.failure.message


def test_a_decision_by_a_name_that_is_not_utf8_is_recorded(tmp_path: Path) -> None:
    """`keel deny RUN CALL --by $'\\xff'`: argv hands Python a lone surrogate (surrogateescape);
    the decision is recorded with U+FFFD, and the denied call is answered."""
    db = tmp_path / "runs.sqlite"
    (tmp_path / "repo").mkdir()
    write = ToolCall.from_arguments("w1", "write_file", {"path": "a.txt", "content": "x"})
    store = keel.Store(db)
    tools = keel.write_tools(tmp_path / "repo")
    agent = keel.Agent(Hostile(ModelResponse(None, (write,))), tools=tools, store=store)
    paused = asyncio.run(agent.arun("Write it."))
    call_id = paused.pending_approvals[0].call_id
    agent.deny(paused.run_id, call_id, reason="no \udcff", by="ana\udcff")
    record = store.get_run(paused.run_id)
    assert record is not None
    assert record.state.decisions[call_id].by == f"ana{SHOWN}"
    assert record.state.decisions[call_id].reason == f"no {SHOWN}"
