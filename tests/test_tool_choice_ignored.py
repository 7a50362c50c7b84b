"""A `tool_choice: "required"` that a server ignored is reported, never passed off (issue 26,
ADR 0036): `--first-turn-tool` against a server that answered in text anyway produced
`completed · 0 tool calls` with an invented answer and nothing said."""

from __future__ import annotations

import json
import re
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

from typer.testing import CliRunner

import keel
from keel.cli.app import app
from keel.records import ToolChoiceIgnored
from loopback_http import QuietHandler, serving

runner = CliRunner()


class IgnoresToolChoice(QuietHandler):
    """An OpenAI-compatible server that answers every request in text, whatever it asked."""

    seen: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        IgnoresToolChoice.seen.append(body)
        answer = {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 0,
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "It depends on nothing."},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        }
        self.reply(json.dumps(answer).encode())


def test_a_server_ignoring_tool_choice_required_is_reported_in_the_run_and_summary(
    tmp_path: Path,
) -> None:
    (tmp_path / "notes.md").write_text("notes\n")
    store = tmp_path / "runs.sqlite"
    IgnoresToolChoice.seen = []
    with serving(ThreadingHTTPServer(("127.0.0.1", 0), IgnoresToolChoice)) as server:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        result = runner.invoke(
            app,
            ["run", "What does it depend on?", "--model", "openai-chat:m", "--base-url", url,
             "--repo", str(tmp_path), "--store", str(store), "--first-turn-tool"],
            env={"OPENAI_API_KEY": "sk-test"},
        )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert IgnoresToolChoice.seen[0]["tool_choice"] == "required"  # it was asked
    assert 'tool_choice "required" ignored by the model\'s server (step 1)' in result.stderr
    run_id = re.search(r"run (run_\w+)", result.stderr)
    assert run_id is not None
    db = keel.Store(store)
    ignored = [e for e in db.events(run_id.group(1)) if isinstance(e, ToolChoiceIgnored)]
    db.close()
    assert [(e.step, e.requested) for e in ignored] == [(1, "required")]
    shown = runner.invoke(app, ["show", run_id.group(1), "--store", str(store)])
    assert "tool_choice ignored" in shown.stdout


async def test_a_required_turn_that_calls_a_tool_records_nothing_of_the_kind(
    tmp_path: Path,
) -> None:
    (tmp_path / "notes.md").write_text("notes\n")
    read = {"tool_calls": [{"name": "read_file", "arguments": {"path": "notes.md"}}]}
    model = keel.ScriptedTransport.from_dict({"turns": [read, {"text": "notes"}]})
    store = keel.Store(":memory:")
    agent = keel.Agent(
        model,
        tools=keel.file_tools(tmp_path),
        store=store,
        limits=keel.Limits(first_turn_tool=True),
    )
    result = await agent.arun("q")
    assert result.status == "completed"
    assert not [e for e in store.events(result.run_id) if isinstance(e, ToolChoiceIgnored)]
