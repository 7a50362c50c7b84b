"""A2A's request handler over Keel's store: the `a2a-sdk`'s JSON-RPC and HTTP+JSON bindings call
it, it answers from the run service (ADR 0040).

Why not the SDK's `DefaultRequestHandler` with a Keel task store: it keeps each active task's
event queue in this process's memory, so a subscriber after a restart (or on another machine's
worker) would get nothing, and its cancel only cancels the coroutine it started. Here every
answer is read from the store, the record `keel show` reads: a task is a run, a stream is the
run's event log followed as it grows, so a resubscribe continues where the task snapshot it
starts with ends, and a restart of `keel serve` loses nothing a client can ask about.

Errors are the SDK's, as the spec names them: an unknown task is TaskNotFound, a message to an
ended task UnsupportedOperation, a bad decision InvalidParams, a cancel of an ended run
TaskNotCancelable; push notifications are not offered (the card says so).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

from a2a.helpers.proto_helpers import get_message_text
from a2a.server.context import ServerCallContext
from a2a.server.events.event_queue import Event as A2AEvent
from a2a.server.request_handlers.request_handler import RequestHandler
from a2a.types import (
    AgentCard,
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetExtendedAgentCardRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    ListTaskPushNotificationConfigsResponse,
    ListTasksRequest,
    ListTasksResponse,
    Message,
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
    TaskPushNotificationConfig,
    TaskState,
)
from a2a.utils.errors import (
    ExtendedAgentCardNotConfiguredError,
    InvalidParamsError,
    PushNotificationNotSupportedError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from a2a.utils.task import apply_history_length

from keel.errors import AlreadyDecided, ConfigError
from keel.result import TERMINAL
from keel.serve import a2a_tasks as tasks
from keel.serve.runs import NotCancelable, RunService, stopped
from keel.store import RunRecord

__all__ = ["KeelRequestHandler"]

DEFAULT_PAGE = 50
MAX_PAGE = 100
MAX_TOKEN_DIGITS = 12
"""A page token is an offset into the runs: more digits than this is no token of ours."""


class KeelRequestHandler(RequestHandler):
    def __init__(self, service: RunService) -> None:
        self.service = service

    # -- tasks -----------------------------------------------------------------------------------

    def _record(self, task_id: str) -> RunRecord:
        record = self.service.record(task_id) if task_id else None
        if record is None:
            raise TaskNotFoundError(message=f"no task {task_id!r} on this server")
        return record

    def _task(self, record: RunRecord, *, artifacts: bool = True) -> Task:
        return tasks.task_of(record, self.service.events(record.run_id), artifacts=artifacts)

    async def on_get_task(self, params: GetTaskRequest, context: ServerCallContext) -> Task:
        task = self._task(self._record(params.id))
        return apply_history_length(task, params)

    async def on_list_tasks(
        self, params: ListTasksRequest, context: ServerCallContext
    ) -> ListTasksResponse:
        """Newest first; filtered by context (conversation), state and update time; paged by
        an offset token."""
        size = params.page_size or DEFAULT_PAGE
        if not 1 <= size <= MAX_PAGE:
            raise InvalidParamsError(message=f"page_size must be 1 to {MAX_PAGE}")
        offset = _offset(params.page_token)
        page, total = self._listed(params, offset, size)
        listed = [
            apply_history_length(self._task(r, artifacts=params.include_artifacts), params)
            for r in page
        ]
        return ListTasksResponse(
            tasks=listed,
            next_page_token=str(offset + size) if offset + size < total else "",
            page_size=size,
            total_size=total,
        )

    def _listed(
        self, params: ListTasksRequest, offset: int, size: int
    ) -> tuple[list[RunRecord], int]:
        """One page of the runs, and how many there are in all."""
        store = self.service.store
        plain = params.status == TaskState.TASK_STATE_UNSPECIFIED
        if plain and not params.context_id and not params.HasField("status_timestamp_after"):
            return store.list_runs(size, offset=offset), store.count_runs()
        records = self._filtered(params)
        return records[offset : offset + size], len(records)

    def _filtered(self, params: ListTasksRequest) -> list[RunRecord]:
        store = self.service.store
        if params.context_id:
            records = list(reversed(store.conversation(params.context_id)))
        else:
            records = store.list_runs(store.count_runs(), offset=0)
        if params.status != TaskState.TASK_STATE_UNSPECIFIED:
            records = [r for r in records if tasks.state_of(r) == params.status]
        if params.HasField("status_timestamp_after"):
            after = params.status_timestamp_after.ToSeconds()
            records = [r for r in records if r.updated_at > after]
        return records

    async def on_cancel_task(self, params: CancelTaskRequest, context: ServerCallContext) -> Task:
        self._record(params.id)
        try:
            record = await self.service.cancel(params.id)
        except NotCancelable as exc:
            raise TaskNotCancelableError(message=str(exc)) from None
        return self._task(record)

    # -- messages --------------------------------------------------------------------------------

    async def on_message_send(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> Task | Message:
        """Waits for the run to stop (ended or paused) unless asked to return at once."""
        run_id = ""
        async for record in self._advance(params):
            run_id = record.run_id
        if not params.configuration.return_immediately:
            events = self.service.events(run_id)
            async for _ in self.service.follow(run_id, events[-1].seq if events else -1):
                pass
        return apply_history_length(self._task(self._record(run_id)), params.configuration)

    async def on_message_send_stream(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[A2AEvent]:
        """The task as it stands, then each recorded event, then the answer and final state."""
        first = True
        async for record in self._advance(params):
            if first:
                first = False
                snapshot = self._task(record)
                yield snapshot
                async for event in self._follow(record, int(_last_seq(snapshot))):
                    yield event

    async def _advance(self, params: SendMessageRequest) -> AsyncGenerator[RunRecord]:
        """Start the run (a new task) or go on with it (decisions on a paused task); yields its
        record once it is under way."""
        if not params.HasField("message"):
            raise InvalidParamsError(message="the request holds no message")
        message = params.message
        if message.task_id:
            record = self._record(message.task_id)
            yield await self._reply(record, message)
            return
        conversation = message.context_id or None
        if conversation is not None and not self.service.store.conversation(conversation):
            raise InvalidParamsError(
                message=f"no context {conversation!r} here: leave contextId out to begin one"
            )
        try:
            record = await self.service.start(get_message_text(message), conversation)
        except ConfigError as exc:
            raise InvalidParamsError(message=str(exc)) from None
        yield record

    async def _reply(self, record: RunRecord, message: Message) -> RunRecord:
        if record.status in TERMINAL:
            state = TaskState.Name(tasks.state_of(record))
            raise UnsupportedOperationError(
                message=f"Task {record.run_id} is in terminal state: {state}; send a new message "
                "with its contextId to ask a follow-up"
            )
        if record.status != "awaiting_approval":
            raise UnsupportedOperationError(
                message=f"task {record.run_id} is {record.status}: it takes a message only "
                "while it waits for decisions (input-required)"
            )
        try:
            decisions = tasks.decisions_of(message)
            if decisions is None:
                decisions = tasks.adk_decision(record, message)
            if decisions is None:
                decisions = tasks.text_decision(record, get_message_text(message))
            else:  # a decision in data: words beside it must not say otherwise
                tasks.check_agreement(decisions, get_message_text(message))
            if decisions is None:
                raise ValueError(f"the task waits for decisions: {tasks.TEXT_HELP}")
            await self.service.decide(record.run_id, decisions)
        except (ValueError, ConfigError, AlreadyDecided) as exc:
            raise InvalidParamsError(message=str(exc)) from None
        return self._record(record.run_id)

    async def on_subscribe_to_task(
        self, params: SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[A2AEvent]:
        """The task as it stands (every event so far in its history), then the events after
        it: a client that reconnects misses none and sees none twice."""
        record = self._record(params.id)
        if record.status in TERMINAL:
            state = TaskState.Name(tasks.state_of(record))
            raise UnsupportedOperationError(
                message=f"Task {record.run_id} is in terminal state: {state}"
            )
        snapshot = self._task(record)
        yield snapshot
        async for event in self._follow(record, int(_last_seq(snapshot))):
            yield event

    async def _follow(self, record: RunRecord, after: int) -> AsyncGenerator[A2AEvent]:
        last = record
        async for batch, current in self.service.follow(record.run_id, after):
            last = current
            for event in batch:
                yield tasks.event_update(current, event)
        if stopped(last):
            for closing in tasks.final_events(self._record(record.run_id)):
                yield closing

    # -- what Keel does not offer ----------------------------------------------------------------

    async def on_create_task_push_notification_config(
        self, params: TaskPushNotificationConfig, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        raise PushNotificationNotSupportedError

    async def on_get_task_push_notification_config(
        self, params: GetTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        raise PushNotificationNotSupportedError

    async def on_list_task_push_notification_configs(
        self, params: ListTaskPushNotificationConfigsRequest, context: ServerCallContext
    ) -> ListTaskPushNotificationConfigsResponse:
        raise PushNotificationNotSupportedError

    async def on_delete_task_push_notification_config(
        self, params: DeleteTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> None:
        raise PushNotificationNotSupportedError

    async def on_get_extended_agent_card(
        self, params: GetExtendedAgentCardRequest, context: ServerCallContext
    ) -> AgentCard:
        raise ExtendedAgentCardNotConfiguredError


def _last_seq(task: Task) -> float:
    return float(task.metadata.fields["keel_last_seq"].number_value)


def _offset(token: str) -> int:
    """The offset a page token of this server names (the digits of a count of runs); a token
    it cannot have given (too long, signed, not digits) is InvalidParams, never a store error."""
    if not token:
        return 0
    if len(token) > MAX_TOKEN_DIGITS or not token.isascii() or not token.isdigit():
        shown = token[:40] + ("..." if len(token) > 40 else "")
        raise InvalidParamsError(
            message=f"page_token {shown!r} is not one this server gave: pass the "
            "next_page_token of the previous page, or none for the first"
        )
    return int(token)
