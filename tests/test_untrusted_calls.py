"""Attacks from outside a run (tracker issue 20, ADR 0030), each written as it worked before:

- a provider's call ids were trusted as unique, so a reused id inherited an earlier approval,
  one approval covered two calls of a batch, and after a crash one call's effect stood in for
  another's;
- a decision could be decided again, so a denied write ran once someone else approved it.

Keel now gives every call an id of its own (`k<step>_<n>`) and keeps the provider's for the
wire; a decision, once recorded, is final.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

import keel
from hostile_model import HostileModel, wire_problems
from keel import approvals
from keel.messages import (
    AssistantMessage,
    Item,
    ModelRequest,
    ModelResponse,
    ToolResult,
    UserMessage,
    with_keel_ids,
)
from keel.records import ApprovalDecided, ToolResultRecorded
from keel.transports import anthropic, openai_chat, openai_responses
from keel.transports.scripted import ScriptedTransport

WRITE = "write_file"
OLD_STORE = Path(__file__).parent / "data" / "store-0.1.sqlite"
"""Written before Keel gave calls its own ids (see tests/test_records.py)."""
T = TypeVar("T")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    return root


@pytest.fixture
def store(tmp_path: Path) -> keel.Store:
    return keel.Store(tmp_path / "runs.sqlite")


def agent(model: HostileModel, repo: Path, store: keel.Store, **options: Any) -> keel.Agent:
    tools = [*keel.file_tools(repo), *keel.write_tools(repo)]
    return keel.Agent(
        "openai-chat:hostile", base_url=model.base_url, tools=tools, store=store, **options
    )


def write(call_id: str, path: str, content: str) -> tuple[str, str, dict[str, Any]]:
    return (call_id, WRITE, {"path": path, "content": content, "append": True})


def stored(path: Path, read: Callable[[keel.Store], T]) -> T:
    """What `read` finds in the store file at `path`, opened for it and closed again."""
    db = keel.Store(path)
    try:
        return read(db)
    finally:
        db.close()


def cli(store: Path, *args: str, failpoints: str = "") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "KEEL_FAILPOINTS"}
    if failpoints:
        env["KEEL_FAILPOINTS"] = failpoints
    return subprocess.run(
        [sys.executable, "-m", "keel", *args, "--store", str(store)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def run_cli(
    store: Path, model: HostileModel, repo: Path, *extra: str, failpoints: str = ""
) -> subprocess.CompletedProcess[str]:
    return cli(
        store,
        "run",
        "Write the notes.",
        "--model",
        "openai-chat:hostile",
        "--base-url",
        model.base_url,
        "--repo",
        str(repo),
        "--allow-writes",
        "--json",
        *extra,
        failpoints=failpoints,
    )


# -- call ids --------------------------------------------------------------------------------


async def test_a_reused_call_id_does_not_inherit_an_earlier_approval(
    repo: Path, store: keel.Store
) -> None:
    turns = [[write("call_1", "a.txt", "approved\n")], [write("call_1", "b.txt", "evil\n")], "ok"]
    with HostileModel(turns) as model:
        first = await agent(model, repo, store).arun("Write a.txt.")
        (asked,) = first.pending_approvals
        approvals.approve(store, first.run_id, asked.call_id, by="ana")
        second = await agent(model, repo, store).aresume(first.run_id)
    assert (repo / "a.txt").read_text() == "approved\n"
    assert not (repo / "b.txt").exists(), "the second write ran on the first one's approval"
    assert second.status == "awaiting_approval"
    (again,) = second.pending_approvals
    assert again.call_id != asked.call_id and again.arguments["path"] == "b.txt"


async def test_two_calls_sharing_an_id_in_one_batch_each_need_their_own_approval(
    repo: Path, store: keel.Store
) -> None:
    turns = [[write("dup", "a.txt", "yes\n"), write("dup", "b.txt", "no\n")], "ok"]
    with HostileModel(turns) as model:
        paused = await agent(model, repo, store).arun("Write both.")
        first, second = paused.pending_approvals
        approvals.approve(store, paused.run_id, first.call_id, by="ana")
        still = await agent(model, repo, store).aresume(paused.run_id)
        assert not (repo / "b.txt").exists(), "one approval let both calls of the batch run"
        assert [p.call_id for p in still.pending_approvals] == [second.call_id]
        approvals.deny(store, paused.run_id, second.call_id, "not b.txt", by="ana")
        done = await agent(model, repo, store).aresume(paused.run_id)
    assert done.status == "completed"
    assert (repo / "a.txt").read_text() == "yes\n" and not (repo / "b.txt").exists()
    results = {
        e.call_id: e.content
        for e in store.events(paused.run_id)
        if isinstance(e, ToolResultRecorded)
    }
    assert results.keys() == {first.call_id, second.call_id}
    assert results[first.call_id].startswith("appended 4 characters to a.txt")
    assert results[second.call_id].startswith("Denied by ana: not b.txt")
    for body in model.requests:  # both calls answered, under ids the provider can tell apart
        assert wire_problems(body) == []
    (turn,) = [m for m in model.requests[-1]["messages"] if m.get("tool_calls")]
    assert turn["tool_calls"][0]["id"] == "dup"  # the provider's own id, where it is unique


def test_a_crash_between_two_calls_sharing_an_id_leaves_the_second_effect_unknown(
    repo: Path, tmp_path: Path
) -> None:
    path = tmp_path / "runs.sqlite"
    turns = [[write("dup", "log.txt", "one\n"), write("dup", "log.txt", "two\n")], "ok"]
    with HostileModel(turns) as model:
        killed = run_cli(
            path, model, repo, "--approve-tools", WRITE, failpoints="inside_side_effect:2"
        )
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        (run,) = stored(path, lambda db: db.list_runs())
        resumed = cli(path, "resume", run.run_id, "--json")
        assert resumed.returncode == 0, resumed.stderr
    assert (repo / "log.txt").read_text() == "one\ntwo\n"  # neither write ran twice
    results = [
        e
        for e in stored(path, lambda db: db.events(run.run_id))
        if isinstance(e, ToolResultRecorded)
    ]
    assert [r.uncertain for r in results] == [False, True], [r.content for r in results]
    assert results[0].content.startswith("appended 4 characters")
    assert results[1].content.startswith("Effect unknown")
    assert wire_problems(model.requests[-1]) == []


# -- decisions -------------------------------------------------------------------------------


def test_a_denial_is_final_and_a_later_approval_is_refused_naming_it(
    repo: Path, tmp_path: Path
) -> None:
    path = tmp_path / "runs.sqlite"
    turns = [[write("call_1", "notes.md", "overwritten\n")], "I left notes.md alone."]
    with HostileModel(turns) as model:
        paused = run_cli(path, model, repo)
        assert paused.returncode == 3, paused.stderr
        out = json.loads(paused.stdout)
        run_id, call_id = out["run_id"], out["pending_approvals"][0]["call_id"]
        denied = cli(path, "deny", run_id, call_id, "--reason", "not that file", "--by", "alice")
        assert denied.returncode == 0, denied.stderr
        approved = cli(path, "approve", run_id, call_id, "--by", "mallory")
        assert approved.returncode == 2, "a second decision overwrote the denial"
        message = approved.stderr.strip()
        assert "\n" not in message and message.startswith("keel: ")
        assert "already denied by alice" in message and "not that file" in message
        assert " UTC" in message  # when it was decided
        resumed = cli(path, "resume", run_id, "--json")
    assert json.loads(resumed.stdout)["status"] == "completed"
    assert not (repo / "notes.md").exists()
    events = stored(path, lambda db: db.events(run_id))
    decided = [e for e in events if isinstance(e, ApprovalDecided)]
    assert [(e.by, e.approved) for e in decided] == [("alice", False)]


# -- the wire, and runs recorded before Keel's ids ------------------------------------------


def _chat_turn(arguments: list[str]) -> ModelResponse:
    calls = [
        {"id": "dup", "type": "function", "function": {"name": "read_file", "arguments": a}}
        for a in arguments
    ]
    message = {"role": "assistant", "content": None, "tool_calls": calls}
    return openai_chat.from_wire({"choices": [{"message": message}]})


def _responses_turn(arguments: list[str]) -> ModelResponse:
    output = [
        {"type": "function_call", "call_id": "dup", "name": "read_file", "arguments": a}
        for a in arguments
    ]
    return openai_responses.from_wire({"status": "completed", "output": output})


def _anthropic_turn(arguments: list[str]) -> ModelResponse:
    content = [
        {"type": "tool_use", "id": "dup", "name": "read_file", "input": json.loads(a)}
        for a in arguments
    ]
    return anthropic.from_wire({"content": content, "stop_reason": "tool_use"})


def _chat_pairs(body: dict[str, Any]) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    messages = body["messages"]
    calls = [
        (c["id"], c["function"]["arguments"]) for m in messages for c in m.get("tool_calls") or ()
    ]
    answers = [(m["tool_call_id"], m["content"]) for m in messages if m["role"] == "tool"]
    return calls, answers


def _responses_pairs(body: dict[str, Any]) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    items = body["input"]
    calls = [(i["call_id"], i["arguments"]) for i in items if i["type"] == "function_call"]
    answers = [(i["call_id"], i["output"]) for i in items if i["type"] == "function_call_output"]
    return calls, answers


def _anthropic_pairs(body: dict[str, Any]) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    blocks = [b for m in body["messages"] for b in m["content"]]
    calls = [(b["id"], json.dumps(b["input"])) for b in blocks if b["type"] == "tool_use"]
    answers = [(b["tool_use_id"], b["content"]) for b in blocks if b["type"] == "tool_result"]
    return calls, answers


WIRES = {
    "openai-chat": (_chat_turn, lambda r: openai_chat.to_wire(r, model="m"), _chat_pairs),
    "openai-responses": (
        _responses_turn,
        lambda r: openai_responses.to_wire(r, model="m"),
        _responses_pairs,
    ),
    "anthropic": (
        _anthropic_turn,
        lambda r: anthropic.to_wire(r, model="m", max_tokens=100),
        _anthropic_pairs,
    ),
}


@pytest.mark.parametrize("wire", WIRES)
def test_a_provider_repeating_call_ids_still_gets_a_request_it_accepts(wire: str) -> None:
    """Two turns of two calls, all four under the id "dup": the request sends four calls
    under four ids, the provider's where it is still unique, each answered by its own result."""
    turn, to_wire, pairs = WIRES[wire]
    items: list[Item] = [UserMessage("Read them.")]
    for step, paths in ((1, ["a", "b"]), (2, ["c", "d"])):
        response = with_keel_ids(turn([json.dumps({"path": p}) for p in paths]), step)
        items.append(
            AssistantMessage(response.text, response.tool_calls, response.provider_details)
        )
        for call in response.tool_calls:
            text = f"contents of {call.arguments['path']}"
            items.append(ToolResult(call.id, call.name, call.key, text))
    calls, answers = pairs(to_wire(ModelRequest("system", (), tuple(items))))
    ids = [call_id for call_id, _ in calls]
    assert ids[0] == "dup" and len(set(ids)) == 4, ids
    sent = {call_id: json.loads(arguments)["path"] for call_id, arguments in calls}
    assert [(i, text) for i, text in answers] == [(i, f"contents of {sent[i]}") for i in ids]


def test_a_run_recorded_before_keel_ids_resumes_under_the_provider_ids(
    tmp_path: Path,
) -> None:
    """Its events name calls by the provider's ids: decisions keep using those, and only the
    turns after the upgrade get Keel's."""
    path = tmp_path / "old.sqlite"
    shutil.copy(OLD_STORE, path)
    store = keel.Store(path)

    @keel.tool(effect="side_effecting", requires_approval=True)
    def publish(text: str) -> str:
        """Publish a note."""
        return "posted " + text

    script = {
        "turns": [
            {"tool_calls": [{"name": "publish", "arguments": {"text": t}} for t in ("one", "two")]},
            {"tool_calls": [{"name": "publish", "arguments": {"text": "three"}}]},
            {"text": "after"},
        ]
    }

    def resume(run_id: str) -> keel.RunResult:
        transport = ScriptedTransport.from_dict(script, record=True)
        return keel.Agent(transport, tools=[publish], store=store).resume(run_id)

    (paused,) = store.list_runs(status="awaiting_approval")
    (waiting,) = approvals.pending(store, paused.run_id)
    assert waiting.call_id == "call_2"  # as recorded
    approvals.approve(store, paused.run_id, "call_2", by="ben")
    again = resume(paused.run_id)
    (asked,) = again.pending_approvals
    assert asked.call_id == "k2_0" and asked.arguments == {"text": "three"}
    approvals.approve(store, paused.run_id, "k2_0", by="ben")
    assert resume(paused.run_id).answer == "after"
    results = {
        e.call_id: e.content.split(".")[0]
        for e in store.events(paused.run_id)
        if isinstance(e, ToolResultRecorded)
    }
    assert results == {
        "call_1": "Denied by ana: not now",
        "call_2": "posted two",
        "k2_0": "posted three",
    }
    store.close()
