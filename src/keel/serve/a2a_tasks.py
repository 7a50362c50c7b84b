"""Keel runs as A2A tasks: a run is a task, its conversation the task's context, its record the
task's status, history and artifacts (ADR 0040). Pure conversions from the store's records to
the `a2a-sdk`'s protobuf types; nothing is kept beside the record.

- state: queued -> submitted, running -> working, awaiting_approval -> input-required,
  awaiting_children -> working (its children run on the workers, ADR 0069),
  completed -> completed, failed -> failed, cancelled -> canceled.
- history: the question (the user's message), then one agent message per recorded event, a
  data part holding the event as `keel show --json` prints it; `metadata.keel_seq` is its seq.
  The task's `metadata.keel_last_seq` says how far the history goes, so a subscriber that
  reads the task first, then the updates after it, sees every event once.
- input-required: the status message names each pending call, every argument, target first,
  as a data part `{"keel_pending": [...]}`; the reply is a data part `{"keel_decisions": ...}`
  (`decisions_of`), or, when one call waits, the text an ordinary client sends: `approve`,
  `yes`, `deny`, `no`, `deny: REASON` (`text_decision`), or Google ADK's function response to
  the call it made of the pause (`adk_decision`): a data part marked `adk_type:
  function_response` (`{"id", "name", "response"}`), or, from ADK 2, that response as JSON
  text. Its `response` is `{"result": TEXT}` (read as a text reply), `{"approved"|"approve"|
  "confirmed": BOOL, "reason"?: TEXT}`, or `{"keel_decisions": [...]}`.
- completed: an `answer` artifact, the answer's text, and the structured output as a data part
  when the run asked for one. failed: the status message says `kind: message` and carries
  `{"kind", "message"}` as data.
"""

from __future__ import annotations

import json
from typing import Any

from a2a.helpers.proto_helpers import (
    get_data_parts,
    get_message_text,
    new_data_part,
    new_text_part,
)
from a2a.types import (
    Artifact,
    Message,
    Part,
    Role,
    Task,
    TaskArtifactUpdateEvent,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from google.protobuf.json_format import MessageToDict, ParseDict
from google.protobuf.struct_pb2 import Struct

from keel.events import event_json
from keel.present.terminal import TARGET_FIRST
from keel.records import Event
from keel.result import RunStatus
from keel.serve.runs import Decision, waiting
from keel.store import RunRecord

__all__ = [
    "DECISIONS_KEY",
    "PENDING_KEY",
    "STATES",
    "adk_decision",
    "answer_artifact",
    "bounded",
    "check_agreement",
    "decisions_in",
    "decisions_of",
    "event_update",
    "final_events",
    "question_of",
    "state_of",
    "status_of",
    "task_of",
]

STATES: dict[RunStatus, TaskState] = {
    "queued": TaskState.TASK_STATE_SUBMITTED,
    "running": TaskState.TASK_STATE_WORKING,
    "awaiting_approval": TaskState.TASK_STATE_INPUT_REQUIRED,
    "awaiting_children": TaskState.TASK_STATE_WORKING,
    "completed": TaskState.TASK_STATE_COMPLETED,
    "failed": TaskState.TASK_STATE_FAILED,
    "cancelled": TaskState.TASK_STATE_CANCELED,
}
MAX_DEPTH = 20
"""Containers nested deeper than this in a data part are shown shortened, as text. The A2A
types are protobuf, which refuses a message nested past 100 levels (a JSON object costs three,
a list two, the task around the part about ten): past it a task could not be read, nor its
pending call decided."""
SHORTENED_CHARS = 200
PENDING_KEY = "keel_pending"
DECISIONS_KEY = "keel_decisions"
ANSWER = "answer"


def state_of(record: RunRecord) -> TaskState:
    """A paused run whose calls are all decided is about to go on: working."""
    if record.status == "awaiting_approval" and not waiting(record):
        return TaskState.TASK_STATE_WORKING
    return STATES[record.status]


def bounded(value: Any, depth: int = 0) -> Any:
    """`value` with every object or list nested deeper than MAX_DEPTH replaced by the start of
    its JSON text, marked as shortened: what the model wrote stays readable and decidable."""
    if not isinstance(value, dict | list | tuple):
        return value
    if depth >= MAX_DEPTH:
        try:
            text = json.dumps(value, ensure_ascii=False)
        except (RecursionError, ValueError, TypeError):
            text = "[...]" if isinstance(value, list | tuple) else "{...}"
        cut = text[:SHORTENED_CHARS] + ("..." if len(text) > SHORTENED_CHARS else "")
        return f"{cut} (nested deeper than {MAX_DEPTH} levels: shortened)"
    if isinstance(value, dict):
        return {str(k): bounded(v, depth + 1) for k, v in value.items()}
    return [bounded(v, depth + 1) for v in value]


def _data(value: Any, media_type: str = "") -> Part:
    """A data part of `value`, bounded in depth so protobuf takes it."""
    return new_data_part(bounded(value), media_type)


def _metadata(values: dict[str, Any]) -> Struct:
    return ParseDict(values, Struct())


def _message(record: RunRecord, message_id: str, parts: list[Part], **meta: Any) -> Message:
    return Message(
        message_id=message_id,
        context_id=record.conversation_id,
        task_id=record.run_id,
        role=Role.ROLE_AGENT,
        parts=parts,
        metadata=_metadata(meta) if meta else None,
    )


def event_message(record: RunRecord, event: Event) -> Message:
    """One recorded event as an agent message (its data part: the event as `keel show --json`
    prints it)."""
    return _message(
        record,
        f"{record.run_id}/{event.seq}",
        [_data(event_json(event))],
        keel_seq=event.seq,
    )


def _pending(record: RunRecord) -> list[dict[str, Any]]:
    waiting = [p for p in record.state.pending if p.call_id not in record.state.decisions]
    shown = []
    for call in waiting:
        arguments = call.arguments if isinstance(call.arguments, dict) else {"raw": call.arguments}
        order = sorted(
            arguments, key=lambda k: (TARGET_FIRST.index(k) if k in TARGET_FIRST else 99, k)
        )
        shown.append(
            {
                "call_id": call.call_id,
                "name": call.name,
                "call_key": call.call_key,
                "arguments": [{"name": k, "value": arguments[k]} for k in order],
                **({"note": call.note} if call.note else {}),
                **({"expires_at": call.expires_at} if call.expires_at is not None else {}),
            }
        )
    return shown


def status_of(record: RunRecord) -> TaskStatus:
    """The task's status from the run's record, with what a client must read or answer."""
    status = TaskStatus(state=state_of(record))
    status.timestamp.FromSeconds(int(record.updated_at))
    if state_of(record) == TaskState.TASK_STATE_INPUT_REQUIRED:
        pending = _pending(record)
        text = f"run {record.run_id} waits for a decision on {len(pending)} call(s): {TEXT_HELP}"
        parts = [new_text_part(text), _data({PENDING_KEY: pending})]
        status.message.CopyFrom(_message(record, f"{record.run_id}/awaiting", parts))
    elif record.status == "failed" and record.state.failure is not None:
        failure = record.state.failure
        parts = [
            new_text_part(f"{failure.kind}: {failure.message}"),
            _data({"kind": failure.kind, "message": failure.message}),
        ]
        status.message.CopyFrom(_message(record, f"{record.run_id}/failure", parts))
    return status


def answer_artifact(record: RunRecord) -> Artifact | None:
    """The answer of a completed run: its text, and its structured output when it had one."""
    state = record.state
    if record.status != "completed" or state.answer is None:
        return None
    parts = [new_text_part(state.answer, "text/markdown")]
    if state.output is not None:
        parts.append(_data(state.output, "application/json"))
    meta: dict[str, Any] = {"synthesized": state.synthesized or "", "cut_off": state.cut_off}
    if state.partial:
        meta |= {"partial": True, "gaps": list(state.gaps)}
    return Artifact(
        artifact_id=f"{record.run_id}/{ANSWER}",
        name=ANSWER,
        parts=parts,
        metadata=_metadata(meta),
    )


def question_of(record: RunRecord) -> Message:
    return Message(
        message_id=f"{record.run_id}/question",
        context_id=record.conversation_id,
        task_id=record.run_id,
        role=Role.ROLE_USER,
        parts=[new_text_part(record.question)],
    )


def task_of(record: RunRecord, events: list[Event], *, artifacts: bool = True) -> Task:
    """The whole task: status, the question and every event given as history."""
    last = events[-1].seq if events else -1
    task = Task(
        id=record.run_id,
        context_id=record.conversation_id,
        status=status_of(record),
        history=[question_of(record), *(event_message(record, e) for e in events)],
        metadata=_metadata({"keel_last_seq": last, "keel_status": record.status}),
    )
    artifact = answer_artifact(record) if artifacts else None
    if artifact is not None:
        task.artifacts.append(artifact)
    return task


def event_update(record: RunRecord, event: Event) -> TaskStatusUpdateEvent:
    """A recorded event as it streams: the task still working, the event as its message."""
    status = TaskStatus(state=TaskState.TASK_STATE_WORKING, message=event_message(record, event))
    status.timestamp.FromSeconds(int(event.at))
    return TaskStatusUpdateEvent(
        task_id=record.run_id,
        context_id=record.conversation_id,
        status=status,
        metadata=_metadata({"keel_seq": event.seq}),
    )


def final_events(record: RunRecord) -> list[TaskStatusUpdateEvent | TaskArtifactUpdateEvent]:
    """What closes a stream once the run stops: the answer artifact, then the final status."""
    closing: list[TaskStatusUpdateEvent | TaskArtifactUpdateEvent] = []
    artifact = answer_artifact(record)
    if artifact is not None:
        closing.append(
            TaskArtifactUpdateEvent(
                task_id=record.run_id,
                context_id=record.conversation_id,
                artifact=artifact,
                last_chunk=True,
            )
        )
    closing.append(
        TaskStatusUpdateEvent(
            task_id=record.run_id,
            context_id=record.conversation_id,
            status=status_of(record),
            metadata=_metadata({"keel_status": record.status}),
        )
    )
    return closing


APPROVING = frozenset({"approve", "approved", "yes", "y"})
DENYING = frozenset({"deny", "denied", "no", "n"})
TEXT_HELP = (
    "reply approve (or yes), deny (or no), or deny: REASON when one call waits (an ADK client: "
    'a function response {"result": "approve"} or {"approved": true}); or send a data part '
    f'{{"{DECISIONS_KEY}": [{{"call_id": ..., "approve": true, "arguments"?: {{...}}, '
    '"for_run"?: true} | {"call_id": ..., "approve": false, "reason": "..."} | '
    '{"call_id": ..., "answer": "..."}]} naming each call'
)


def text_decision(record: RunRecord, text: str) -> list[Decision] | None:
    """The decision a text reply makes on the one call that waits (`approve`, `yes`, `deny`,
    `no`, `deny: REASON`, any case, a final period ignored); None when the text is none of
    those. ValueError: more than one call waits, so the text cannot say which."""
    word, _, reason = text.strip().partition(":")
    word = word.strip().rstrip(".!").lower()
    if word not in APPROVING | DENYING or (reason and word in APPROVING):
        return None
    return [Decision(_the_one_waiting(record), word in APPROVING, reason.strip())]


def check_agreement(decisions: list[Decision], text: str) -> None:
    """A reply whose text is itself a decision word (`deny`, `yes`, ...) must say what its
    data part says: one that denies in words and approves in data (or the reverse) says two
    things, and is refused (ValueError), nothing recorded."""
    word = text.strip().partition(":")[0].strip().rstrip(".!").lower()
    if word not in APPROVING | DENYING:
        return
    approving = word in APPROVING
    differ = [d.call_id for d in decisions if d.answer is not None or d.approved != approving]
    if differ:
        said = "approves" if approving else "denies"
        raise ValueError(
            f"the reply says two things: its text {said} and its decisions do not "
            f"({', '.join(differ)}); nothing was recorded: send the decisions alone"
        )


def _the_one_waiting(record: RunRecord) -> str:
    """The call_id of the one call that waits. ValueError: more than one waits."""
    undecided = [p.call_id for p in record.state.pending if p.call_id not in record.state.decisions]
    if len(undecided) != 1:
        raise ValueError(
            f"{len(undecided)} calls wait ({', '.join(undecided)}): a reply without call ids "
            f'decides one; send a data part {{"{DECISIONS_KEY}": [...]}} naming each call_id'
        )
    return undecided[0]


def decisions_of(message: Message) -> list[Decision] | None:
    """The decisions a reply carries (`{"keel_decisions": [...]}` in a data part); None when
    it carries none. ValueError: a decision that cannot be read."""
    found: list[Decision] | None = None
    for data in get_data_parts(message.parts):
        if isinstance(data, dict) and DECISIONS_KEY in data:
            found = (found or []) + decisions_in(data[DECISIONS_KEY])
    return found


def decisions_in(given: Any) -> list[Decision]:
    """The decisions of a `keel_decisions` list. ValueError: one that cannot be read."""
    if not isinstance(given, list):
        raise ValueError(f"{DECISIONS_KEY} must be a list of decisions")
    found = []
    for item in given:
        if not isinstance(item, dict) or not isinstance(item.get("call_id"), str):
            raise ValueError(f"each of {DECISIONS_KEY} needs a call_id (text)")
        found.append(_decision(item))
    return found


MAX_ANSWER = 20_000
"""Characters of an answer-instead a client may send (the model reads it as the result)."""


def _decision(item: dict[str, Any]) -> Decision:
    """One decision of `keel_decisions`: `approve` true or false, or `answer` (text); with
    `arguments` (the whole edited arguments), `for_run`, `call_key` (the call seen)."""
    call = item["call_id"]
    answer, arguments = item.get("answer"), item.get("arguments")
    for_run, key = item.get("for_run", False), item.get("call_key")
    if answer is not None and (not isinstance(answer, str) or not answer.strip()):
        raise ValueError(f"decision on {call}: answer must be text")
    if answer is None and not isinstance(item.get("approve"), bool):
        raise ValueError(f"decision on {call}: approve must be true or false (or give answer)")
    if arguments is not None and not isinstance(arguments, dict):
        raise ValueError(f"decision on {call}: arguments must be an object (the whole arguments)")
    if not isinstance(for_run, bool) or (key is not None and not isinstance(key, str)):
        raise ValueError(f"decision on {call}: for_run must be true or false, call_key text")
    if answer is not None and len(answer) > MAX_ANSWER:
        raise ValueError(f"decision on {call}: the answer is over {MAX_ANSWER} characters")
    reason = item.get("reason", "")
    return Decision(
        call,
        bool(item.get("approve", False)) and answer is None,
        str(reason or ""),
        arguments=arguments,
        for_run=for_run,
        answer=answer,
        call_key=key,
    )


ADK_TYPE = "adk_type"
"""The part metadata key ADK marks its function calls and responses with."""
ADK_FUNCTION_RESPONSE = "function_response"
VERDICT_KEYS = ("approved", "approve", "confirmed")
"""The boolean a function response may decide by (`confirmed` is ADK's tool confirmation)."""


def adk_decision(record: RunRecord, message: Message) -> list[Decision] | None:
    """The decision in Google ADK's reply to the function call it made of the pause: a data
    part marked `adk_type: function_response`, or (ADK 2 sends a function response that is not
    `{"result": TEXT}` as its JSON text) a text that is one JSON object. None when the message
    is neither, or its response says nothing Keel reads. ValueError: as `text_decision`."""
    for part in message.parts:
        if part.WhichOneof("content") != "data" or not part.HasField("metadata"):
            continue
        if MessageToDict(part.metadata).get(ADK_TYPE) == ADK_FUNCTION_RESPONSE:
            data = MessageToDict(part.data)
            if isinstance(data, dict):
                return response_decision(record, data.get("response"))
    text = get_message_text(message).strip()
    if not text.startswith("{"):
        return None
    try:
        response = json.loads(text)
    except ValueError:
        return None
    return response_decision(record, response)


def response_decision(record: RunRecord, response: Any) -> list[Decision] | None:
    """The decision a function response's payload makes: `{"keel_decisions": [...]}` names
    each call; `{"result": TEXT}` is read as a text reply; `{"approved": BOOL, "reason":
    TEXT}` (or `approve`, `confirmed`) decides the one call that waits."""
    if not isinstance(response, dict):
        return None
    if DECISIONS_KEY in response:
        return decisions_in(response[DECISIONS_KEY])
    if isinstance(response.get("result"), str):
        return text_decision(record, response["result"])
    verdicts = [response[k] for k in VERDICT_KEYS if isinstance(response.get(k), bool)]
    if not verdicts:
        return None
    reason = response.get("reason")
    return [Decision(_the_one_waiting(record), verdicts[0], str(reason or ""))]
