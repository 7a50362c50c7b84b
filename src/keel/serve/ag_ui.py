"""`POST /ag-ui`: a Keel agent behind the AG-UI protocol, for front ends (ADR 0041).

    app = Starlette(routes=ag_ui_routes(agent))

The body is a `RunAgentInput`, validated with the `ag-ui-protocol` types; the answer is a
server-sent event stream written with that package's encoder:

- without `resume`: a new Keel run, its question the last message's text (a user message's).
  When the thread holds an assistant message of an earlier Keel run, the question is a
  follow-up in that run's conversation (ADR 0038), as `agent.run(q, conversation=...)` asks;
- with `resume`: each entry answers an interrupt Keel sent (its id names the Keel run and the
  call: `run_…:k2_0`). The decisions are recorded through `keel.approvals`, exactly as `keel
  approve`/`keel deny` record them, then the same Keel run resumes from the store.

Nothing is kept in this process between requests: the interrupt ids and message ids say which
run and call they are, and the store holds the rest, so a resume sent after a restart (or to
another process on the same store) continues the run. A request the endpoint refuses (a body
that is not a `RunAgentInput`, no question, an interrupt that is not pending) is a 4xx with a
JSON `{"error": ...}` and records nothing. Once the stream is open it ends with RUN_FINISHED,
or RUN_ERROR: the run failed, or a Keel error stopped it (another process holds it, the store
could not save a step). A client that goes away does not stop the run: it goes on,
recorded, and `keel show` has it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pydantic
from ag_ui.core import (
    PROTOCOL_VERSION,
    BaseEvent,
    CustomEvent,
    MessagesSnapshotEvent,
    ResumeEntry,
    RunAgentInput,
    RunErrorEvent,
    RunStartedEvent,
    StateSnapshotEvent,
    TextPart,
)
from ag_ui.encoder import EventEncoder
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from keel import approvals
from keel.agent import Agent
from keel.errors import AlreadyDecided, ConfigError, DecisionExpired, KeelError, LeaseHeld
from keel.events import RunStream
from keel.records import ApprovalDecided, Decision
from keel.result import OVER
from keel.serve.ag_ui_events import (
    EventMapper,
    call_id_of,
    ending,
    messages_snapshot,
    state_snapshot,
)
from keel.serve.doors import headers_of, refusal
from keel.serve.runs import mismatch
from keel.store import RunRecord
from keel.ui.text import clean

__all__ = ["CANCELLED_REASON", "MAX_BODY_BYTES", "MAX_REASON", "ag_ui_routes"]

MAX_BODY_BYTES = 4 * 1024 * 1024
"""The largest request body read: a thread's messages, not a file upload."""
CANCELLED_REASON = "the person dismissed the approval in the front end (AG-UI: cancelled)"
"""A resume entry with status `cancelled` abandons the interrupt: the call is denied, with this
reason told to the model."""
DENIED_REASON = "denied in the front end"
"""The reason recorded for a denial that gave none."""
MAX_REASON = 2_000
"""A denial's reason is cut here (as the web view's is)."""


class Refused(Exception):
    """A request refused before anything is recorded: its HTTP status and why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class ApprovalAnswer(pydantic.BaseModel):
    """A resolved resume entry's payload (`APPROVAL_SCHEMA`)."""

    model_config = pydantic.ConfigDict(extra="forbid", strict=True)
    approved: bool
    reason: str | None = None
    arguments: dict[str, Any] | None = None
    """Approved with these arguments instead of the model's (ADR 0052)."""
    for_run: bool = False
    answer: str | None = pydantic.Field(default=None, max_length=20_000)
    """Answered instead: the call's result, the tool not run (`approved` is then ignored)."""


@dataclass(frozen=True, slots=True)
class Answer:
    """One decision a resume carries, checked against the stored run."""

    call_id: str
    approved: bool
    reason: str | None
    recorded: bool
    """The same decision is in the store already (a resume sent again): not recorded twice."""
    arguments: dict[str, Any] | None = None
    for_run: bool = False
    answer: str | None = None

    def decision(self) -> Decision:
        """What the store records, by "ag-ui"; the reason and answer are untrusted and told
        to the model: cleaned as `keel ui` cleans them."""
        if self.answer is not None:
            return Decision(False, "ag-ui", answer=clean(self.answer).strip() or "(empty)")
        if not self.approved:
            reason = clean(self.reason or "").strip()[:MAX_REASON] or DENIED_REASON
            return Decision(False, "ag-ui", reason)
        return Decision(True, "ag-ui", arguments=self.arguments, for_run=self.for_run)


def ag_ui_routes(agent: Agent, *, path: str = "/ag-ui") -> list[BaseRoute]:
    """The AG-UI endpoint for `agent`: `POST path`. Runs and resumes go through the agent and
    its store (`agent.store`); its tools, limits and approvals are the served agent's."""
    endpoint = AgUiEndpoint(agent)
    return [Route(path, endpoint.handle, methods=["POST"])]


class AgUiEndpoint:
    """The request handler: refuse, or start (or resume) the run and stream it."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self._draining: set[asyncio.Task[None]] = set()
        """Runs whose client went away, followed to their end (never their state: the store's)."""

    async def handle(self, request: Request) -> Response:
        door = refusal(request.scope, headers_of(request.scope))
        if door is not None:  # mounted in an app without `keel serve`'s doors too
            return JSONResponse({"error": door[1]}, status_code=door[0])
        try:
            run = parse_input(await read_body(request))
            stream, decided = await self._start(run)
        except Refused as refused:
            return JSONResponse({"error": refused.message}, status_code=refused.status)
        encoder = EventEncoder(accept=request.headers.get("accept", ""))
        return StreamingResponse(
            self._events(run, stream, decided, encoder),
            media_type=encoder.get_content_type(),
            headers={"cache-control": "no-store", "x-accel-buffering": "no"},
        )

    async def _start(self, run: RunAgentInput) -> tuple[RunStream, list[ApprovalDecided]]:
        """The run's stream, and the decisions this request recorded (a resume's), which no
        run's stream carries: `keel approve` writes them, not a run (ADR 0024). Decisions are
        checked and recorded off the event loop (edited arguments: keel/approvals.py)."""
        try:
            if run.resume:
                run_id, calls = await asyncio.to_thread(self._decide, run.resume)
                decided = [
                    e
                    for e in self.agent.store.events(run_id)
                    if isinstance(e, ApprovalDecided) and e.call_id in calls
                ]
                return self.agent.stream_resume(run_id), decided
            question = question_of(run)
            return self.agent.stream(question, conversation=self._conversation(run)), []
        except LeaseHeld as held:
            raise Refused(409, str(held)) from None
        except DecisionExpired as expired:  # its denial is recorded: the run goes on from it
            self._go_on_denied(run)
            raise Refused(409, str(expired)) from None
        except AlreadyDecided as decided:
            raise Refused(409, str(decided)) from None
        except ConfigError as error:
            raise Refused(409, str(error)) from None

    def _conversation(self, run: RunAgentInput) -> str | None:
        """The Keel conversation of the thread's newest Keel answer, if the store has it."""
        for message in reversed(run.messages):
            named = call_id_of(message.id) if message.role == "assistant" else None
            if named is None:
                continue
            record = self.agent.store.get_run(named[0])
            if record is not None:
                return record.config.conversation_id or record.run_id
        return None

    def _decide(self, entries: list[ResumeEntry]) -> tuple[str, set[str]]:
        """Check every entry against the stored run, then record the decisions: the run id
        and the calls answered."""
        run_id, answers = check_resume(entries, self.agent.store.get_run)
        record = self.agent.store.get_run(run_id)
        why = mismatch(self.agent, record) if record is not None else None
        if why:  # before anything is recorded: the run's own agent must take it on
            raise Refused(
                409,
                f"run {run_id} cannot go on here: {why}; resume it from a server started with "
                "its options, or decide with `keel approve`/`keel deny` and `keel resume` it",
            )
        fresh = [a for a in answers if not a.recorded]
        for answer in fresh:  # all checked (edited arguments too) before any is recorded
            approvals.check(
                self.agent.store,
                run_id,
                answer.call_id,
                answer.decision(),
                validate=self.agent._validate_arguments,
            )
        for answer in fresh:
            approvals.decide(self.agent.store, run_id, answer.call_id, answer.decision())
        return run_id, {a.call_id for a in answers}

    async def _events(
        self,
        run: RunAgentInput,
        stream: RunStream,
        decided: list[ApprovalDecided],
        encoder: EventEncoder,
    ) -> AsyncIterator[str]:
        """The run's stream as encoded events, always ending with one terminal event."""
        yield encoder.encode(
            RunStartedEvent(
                thread_id=run.thread_id, run_id=run.run_id, protocol_version=PROTOCOL_VERSION
            )
        )
        keel_run = stream.run_id
        yield encoder.encode(
            CustomEvent(name="keel.run", value={"run_id": keel_run, "resumed": bool(run.resume)})
        )
        mapper = EventMapper(keel_run)
        for decision in decided:
            for out in mapper.feed(decision):
                yield encoder.encode(out)
        ended = False
        try:
            async for event in stream:
                for out in mapper.feed(event):
                    yield encoder.encode(out)
            result = await stream
            ended = True
        except KeelError as error:  # the run could not go on: LeaseHeld, LeaseLost, StoreError
            ended = True
            for out in mapper.close():
                yield encoder.encode(out)
            yield encoder.encode(RunErrorEvent(message=str(error), code=type(error).__name__))
            return
        finally:
            if not ended:  # the client went away (the response was cancelled)
                self._drain(stream)
        for out in mapper.close():
            yield encoder.encode(out)
        for out in self._snapshots(run, keel_run):
            yield encoder.encode(out)
        yield encoder.encode(ending(run.thread_id, run.run_id, result))

    def _go_on_denied(self, run: RunAgentInput) -> None:
        """After a decision came too late (the call's approval expired and its denial was
        recorded instead): once no call of the run waits, it goes on without its client."""
        named = call_id_of(run.resume[0].interrupt_id) if run.resume else None
        if named is None:
            return
        run_id = named[0]
        store = self.agent.store
        with contextlib.suppress(KeelError):
            if not approvals.pending(store, run_id):
                self._drain(self.agent.stream_resume(run_id))

    def _drain(self, stream: RunStream) -> None:
        """The run goes on without its client: its events are taken and dropped as they come
        (the store has them), and its task stays referenced until it ends."""

        async def drain() -> None:
            with contextlib.suppress(KeelError):
                async for _ in stream:
                    pass
                await stream

        task = asyncio.ensure_future(drain())
        self._draining.add(task)
        task.add_done_callback(self._draining.discard)

    def _snapshots(self, run: RunAgentInput, run_id: str) -> list[BaseEvent]:
        """STATE_SNAPSHOT and MESSAGES_SNAPSHOT from the stored run, before the terminal
        event: what a front end shows for a paused run, and the record's own answer."""
        store = self.agent.store
        record = store.get_run(run_id)
        if record is None:  # an agent without a durable store never loses its run; defensive
            return []
        messages = messages_snapshot(run_id, record.question, store.events(run_id), run.messages)
        return [
            StateSnapshotEvent(snapshot=state_snapshot(record)),
            MessagesSnapshotEvent(messages=messages),
        ]


async def read_body(request: Request) -> bytes:
    """The body, refused past `MAX_BODY_BYTES` (413) without reading the rest."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise Refused(413, f"the body is larger than {MAX_BODY_BYTES} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def parse_input(body: bytes) -> RunAgentInput:
    """The body as a `RunAgentInput`; a 422 naming the first problems otherwise."""
    try:
        return RunAgentInput.model_validate_json(body)
    except pydantic.ValidationError as invalid:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}"
            for e in invalid.errors(include_url=False)[:5]
        )
        raise Refused(422, f"the body is not an AG-UI RunAgentInput: {problems}") from None


def question_of(run: RunAgentInput) -> str:
    """The last message's text, which must be a user's: the question of the run."""
    if not run.messages or run.messages[-1].role != "user":
        raise Refused(422, "a new run needs a user message last in `messages`: the question")
    content = run.messages[-1].content
    text = (
        content
        if isinstance(content, str)
        else "\n".join(part.text for part in content if isinstance(part, TextPart))
    )
    if not text.strip():
        raise Refused(422, "the last user message has no text: Keel's question is text")
    return text


def check_resume(
    entries: list[ResumeEntry], get_run: Callable[[str], RunRecord | None]
) -> tuple[str, list[Answer]]:
    """The run the entries resume and their decisions, each checked before any is recorded:
    every id one Keel gave, one run, that run not ended, each call pending there, and every
    pending call answered (a resume continues the run only when none is left waiting)."""
    named: list[tuple[str, str, ResumeEntry]] = []
    for entry in entries:
        ids = call_id_of(entry.interrupt_id)
        if ids is None:
            raise Refused(422, f"interrupt {entry.interrupt_id!r} is not one Keel sent")
        named.append((*ids, entry))
    runs = {run_id for run_id, _, _ in named}
    if len(runs) != 1:
        raise Refused(422, f"the resume answers interrupts of several runs: {sorted(runs)}")
    run_id = runs.pop()
    record = get_run(run_id)
    if record is None:
        raise Refused(404, f"no run {run_id} in this store")
    if record.status in OVER:
        raise Refused(409, f"run {run_id} has ended ({record.status}): it takes no decisions")
    pending = {p.call_id for p in record.state.pending}
    answers = [_answer(record, call_id, entry, pending) for _, call_id, entry in named]
    if len({a.call_id for a in answers}) != len(answers):
        raise Refused(422, "the resume answers one interrupt twice")
    answered = {a.call_id for a in answers} | set(record.state.decisions)
    missing = sorted(pending - answered)
    if missing:
        unanswered = ", ".join(f"{run_id}:{c}" for c in missing)
        raise Refused(422, f"the resume leaves pending interrupts unanswered: {unanswered}")
    return run_id, answers


def _answer(record: RunRecord, call_id: str, entry: ResumeEntry, pending: set[str]) -> Answer:
    if call_id not in pending:
        raise Refused(422, f"{entry.interrupt_id} is not a call of run {record.run_id} that "
                      "waits for a decision")  # fmt: skip
    reason: str | None = CANCELLED_REASON
    approved = False
    if entry.status != "cancelled":
        try:
            payload = ApprovalAnswer.model_validate(entry.payload)
        except pydantic.ValidationError as invalid:
            first = invalid.errors(include_url=False)[0]
            where = ".".join(str(p) for p in first["loc"]) or "payload"
            raise Refused(
                422,
                f'the answer to {entry.interrupt_id} must be {{"approved": true|false, '
                '"reason"?: text, "arguments"?: {...}, "for_run"?: bool, "answer"?: text}: '
                f'{where}: {first["msg"]}',
            ) from None
        approved, reason = payload.approved and payload.answer is None, payload.reason
    else:
        payload = ApprovalAnswer(approved=False)
    decided = record.state.decisions.get(call_id)
    if decided is not None and decided.approved != approved:
        what = "approved" if decided.approved else "denied"
        raise Refused(409, f"{entry.interrupt_id} was {what} already by {decided.by}: "
                      "decisions are final")  # fmt: skip
    return Answer(
        call_id,
        approved,
        reason,
        recorded=decided is not None,
        arguments=payload.arguments,
        for_run=payload.for_run,
        answer=payload.answer,
    )
