"""The anchor: the same model, transport and file tools in a plain loop without Keel's rules.

What an agent loop written in an afternoon does: send the question and the tools, run every
call the model asks for, send the results back, and stop when the model answers or after as
many calls as Keel's run is allowed. No first turn that must call a tool (so no first-call
steering), no synthesis turn at the limit (a run that is still calling tools at its last call
has no answer), no loop breaker, no elision of old results, no citation ids. Results are cut
to `RESULT_CHARS` (a loop has to cut somewhere to fit an 8k window: a plain head cut, as such
loops do); a request too long for the window ends the run as a model error. It exists only to
measure what the runtime adds (issue 51), on the same questions.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

from keel.errors import KeelError
from keel.evals.swe_qa.archive import Question
from keel.messages import (
    AssistantMessage,
    Item,
    ModelRequest,
    ToolResult,
    Usage,
    UserMessage,
)
from keel.records import Event, JsonValue, ToolCallRequested, ToolResultRecorded
from keel.result import Failure, RunResult
from keel.tools.files import file_tools
from keel.transports.base import Transport

__all__ = ["PLAIN_SYSTEM_PROMPT", "RESULT_CHARS", "Watch", "plain_run"]

PLAIN_SYSTEM_PROMPT = (
    "You answer questions about a software repository. Use the tools to look at its files, "
    "then answer the question."
)
RESULT_CHARS = 8_000


async def plain_run(
    question: Question, repo: Path, transport: Transport, timeout: float, max_calls: int
) -> tuple[RunResult, bool, Watch]:
    """The plain loop's result as a RunResult (status, answer, counts, usage), whether it
    outlived `timeout`, and what it called and read."""
    watch = Watch()
    state = _Loop(question, repo, transport, max_calls, watch)
    try:
        result = await asyncio.wait_for(state.run(), timeout)
        return result, False, watch
    except TimeoutError:
        return state.result("cancelled", None), True, watch


class Watch:
    """A listener: the run's tool calls, and the files read_file returned text for."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.opened: list[str] = []
        self.searched = 0
        self._paths: dict[str, str] = {}

    def __call__(self, event: Event) -> None:
        if isinstance(event, ToolCallRequested):
            args = event.arguments if isinstance(event.arguments, dict) else {}
            self.calls.append(f"{event.name} {json.dumps(event.arguments, ensure_ascii=False)}")
            if event.name == "read_file" and isinstance(args.get("path"), str):
                self._paths[event.call_id] = str(args["path"])
            self.searched += event.name == "search_files"
        elif isinstance(event, ToolResultRecorded) and not event.is_error:
            path = self._paths.pop(event.call_id, None)
            if path is not None:
                self.opened.append(path)


class _Loop:
    def __init__(
        self, question: Question, repo: Path, transport: Transport, max_calls: int, watch: Watch
    ) -> None:
        self.tools = {t.name: t for t in file_tools(repo)}
        self.transport = transport
        self.max_calls = max_calls
        self.watch = watch
        self.items: list[Item] = [UserMessage(question.question)]
        self.model_calls = 0
        self.tool_calls = 0
        self.usage = Usage()
        self.run_id = f"plain-{uuid.uuid4().hex[:12]}"

    def result(self, status: str, answer: str | None, failure: Failure | None = None) -> RunResult:
        return RunResult(
            run_id=self.run_id,
            status=status,  # type: ignore[arg-type]
            answer=answer,
            synthesized=None,
            failure=failure,
            model_calls=self.model_calls,
            tool_calls=self.tool_calls,
            usage=self.usage,
        )

    async def run(self) -> RunResult:
        definitions = tuple(t.definition() for t in self.tools.values())
        while self.model_calls < self.max_calls:
            request = ModelRequest(PLAIN_SYSTEM_PROMPT, definitions, tuple(self.items))
            self.model_calls += 1
            try:
                response = await self.transport.request(request)
            except KeelError as exc:
                failure = Failure("ModelError", str(exc)[:500], self.model_calls)
                return self.result("failed", None, failure)
            self.usage = self.usage + response.usage
            if not response.tool_calls:
                return self.result("completed", response.text)
            self.items.append(AssistantMessage(response.text, response.tool_calls))
            for call in response.tool_calls:
                self.items.append(await self._call(call.id, call.name, call.arguments))
        failure = Failure(
            "BudgetExhausted", "still calling tools at the last call", self.model_calls
        )
        return self.result("failed", None, failure)

    async def _call(self, call_id: str, name: str, arguments: JsonValue) -> ToolResult:
        self.tool_calls += 1
        self.watch(
            ToolCallRequested(
                call_id=call_id,
                name=name,
                arguments=arguments,
                call_key="",
            )
        )
        tool = self.tools.get(name)
        error = True
        if tool is None:
            content = f"error: no tool named {name}"
        else:
            try:
                content = await tool.invoke(await tool.checked(arguments or {}))
                error = False
            except Exception as exc:  # a plain loop hands any error back as text
                content = f"error: {exc}"
        self.watch(
            ToolResultRecorded(
                call_id=call_id,
                call_key="",
                name=name,
                content="",
                is_error=error,
            )
        )
        return ToolResult(call_id, name, "", content[:RESULT_CHARS], is_error=error)
