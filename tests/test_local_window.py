"""A local model's window is small and hard: its context budget stays inside the window, and one
tool result is cut to a quarter of that budget, because the newest result is never elided and a
larger one would end the run with a context overflow. A model without a window keeps the run's
`max_result_chars`. A fake LocalModel (no llama.cpp) counts characters as tokens."""

from __future__ import annotations

from pathlib import Path

import keel
from keel.agent import CHARS_PER_TOKEN, RESULTS_PER_WINDOW, WINDOW_MARGIN
from keel.messages import ModelRequest, ModelResponse, ToolCall
from keel.records import ToolResultRecorded
from keel.tokens import TokenCounter


class Chars:
    def count(self, text: str) -> int:
        return len(text)


class TinyLocal:
    """A LocalModel with a 3000-token window that reads a big file, then answers."""

    name = "tiny-local"

    def __init__(self) -> None:
        self.requests: list[ModelRequest] = []

    @property
    def input_token_limit(self) -> int:
        return 3000

    def token_counter(self) -> TokenCounter:
        return Chars()

    async def request(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        if len(self.requests) == 1:
            call = ToolCall.from_arguments("c1", "read_file", {"path": "big.txt"})
            return ModelResponse(None, (call,))
        return ModelResponse("done")


def big_repo(tmp_path: Path) -> Path:
    (tmp_path / "big.txt").write_text("line of text\n" * 3000)  # 39,000 characters
    return tmp_path


def test_a_local_models_results_are_cut_to_fit_its_window(tmp_path: Path) -> None:
    transport = TinyLocal()
    with keel.Agent(
        transport, tools=keel.file_tools(big_repo(tmp_path)), store=tmp_path / "r.db"
    ) as agent:
        result = agent.run("What is in big.txt?")
        events = agent.store.events(result.run_id)
    assert result.status == "completed", result.failure
    budget = 3000 - WINDOW_MARGIN
    cap = budget * CHARS_PER_TOKEN // RESULTS_PER_WINDOW
    shown = next(e for e in events if isinstance(e, ToolResultRecorded))
    assert shown.truncated
    head = shown.content.rsplit("\n[truncated:", 1)[0]
    assert cap - 400 < len(head) <= cap  # cut after a whole line, within the cap (ADR 0036)
    assert len(shown.content) < cap + 200  # the cut plus its marker


def test_without_a_window_results_keep_the_runs_limit(tmp_path: Path) -> None:
    script = keel.ScriptedTransport.from_dict(
        {
            "turns": [
                {"tool_calls": [{"name": "read_file", "arguments": {"path": "big.txt"}}]},
                {"text": "done"},
            ]
        }
    )
    with keel.Agent(
        script, tools=keel.file_tools(big_repo(tmp_path)), store=tmp_path / "r.db"
    ) as agent:
        result = agent.run("What is in big.txt?")
        shown = next(
            e for e in agent.store.events(result.run_id) if isinstance(e, ToolResultRecorded)
        )
    assert not shown.truncated  # 50,000 characters is the default limit; the file is smaller
