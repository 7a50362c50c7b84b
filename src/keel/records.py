"""The run's record, typed: one class per event kind, the run state and the run's settings.

Every writer and reader of a run (the recorder, resume, `keel show`, progress lines, approvals,
evaluations, the store) uses these classes; nobody reads a run by string key. Every class is
encoded by the one codec (keel.codec), derived from its fields: an event is stored as its `type`,
a JSON object of its fields and, for a tool result, its text as a separate body (cheaper to
write than inside the JSON). What a field's stored form needs beyond its type is a mark on the
field (`OMIT_EMPTY`, `FLAT`), not a case in the encoder.

Decoding is tolerant, so stores written by earlier Keel versions load: a missing optional field
takes its default, an unknown field is ignored, and an event type this version does not know
becomes an `UnknownEvent` that is shown, never dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar, Literal, TypeAlias, cast

from keel.codec import FLAT, OMIT_EMPTY, from_json, to_json
from keel.errors import FailureKind, RunFailure
from keel.limits import REPEAT_TIERS, Limits, current_names
from keel.messages import SynthesisReason, Usage
from keel.result import ChildRun, Failure, PendingApproval, RunResult, RunStatus

__all__ = [
    "ApprovalDecided",
    "ApprovalRequested",
    "ContextShrunk",
    "Decision",
    "Ending",
    "Event",
    "EvidenceRejected",
    "EvidenceReset",
    "HookApplied",
    "HookChange",
    "HostedToolCalled",
    "JsonObject",
    "JsonValue",
    "KeyCounter",
    "Lineage",
    "ModelErrorSeen",
    "ModelRequestSent",
    "ModelResponseReceived",
    "OutputRejected",
    "RecordedCall",
    "RepeatState",
    "ResultClamped",
    "ResultElided",
    "RunCancelled",
    "RunCompleted",
    "RunConfig",
    "RunFailed",
    "RunResumed",
    "RunStarted",
    "RunState",
    "ToolCallRequested",
    "ToolDispatched",
    "ToolResultRecorded",
    "UnknownEvent",
    "decode_event",
    "encode_event",
]

JsonValue: TypeAlias = "str | int | float | bool | list[JsonValue] | dict[str, JsonValue] | None"
JsonObject: TypeAlias = "dict[str, JsonValue]"


# -- events ----------------------------------------------------------------------------------


@dataclass(slots=True, kw_only=True)
class _EventBase:
    """Fields every event has. `seq` and `at` are given when the event is logged."""

    type: ClassVar[str]
    step: int = 0
    """The step the event belongs to (0: before the first model turn)."""
    seq: int = -1
    """Position in the run's log, from 0, without gaps."""
    at: float = 0.0
    """Unix time it was logged."""


@dataclass(slots=True, kw_only=True)
class RunStarted(_EventBase):
    type: ClassVar[str] = "run_started"
    question: str
    model: str
    owner: str | None = None
    """The process that started it (`host:pid:tag`, its lease), None without a store."""


@dataclass(slots=True, kw_only=True)
class RunResumed(_EventBase):
    type: ClassVar[str] = "run_resumed"
    model: str
    open_calls: int = 0
    """Calls of the last batch that had no result when the run stopped."""
    owner: str | None = None
    """The process that took the run over (its lease): who advanced the run from here."""


@dataclass(slots=True, kw_only=True)
class ModelRequestSent(_EventBase):
    type: ClassVar[str] = "model_request"
    attempt: int
    """1 for the turn's first attempt; retries and empty-turn repeats count on."""
    tool_choice: Literal["none", "required"] | None
    synthesis: SynthesisReason | None
    """Set when the turn is synthesis-only, with the reason."""
    items: int
    estimated_input_tokens: int
    repeated_prefix_tokens: int | None = None
    """Of `estimated_input_tokens`, those at the start that repeat the previous request byte for
    byte (what a prompt cache can serve); 0 when there was no previous request in the process,
    None in stores written before it was recorded."""


@dataclass(frozen=True, slots=True)
class RecordedCall:
    """A tool call as the model wrote it: replayed on resume exactly as it was received."""

    id: str
    """Keel's id for the call (`ToolCall.id`); in runs recorded before Keel gave its own ids,
    the provider's, which those runs' other events name it by."""
    name: str
    arguments: str
    provider_id: str | None = field(default=None, metadata=OMIT_EMPTY)
    """The provider's id, sent back on the wire; None in runs recorded before Keel's ids (and
    then not stored: `id`, Keel's, is what a reader that knows nothing of it pairs by)."""


@dataclass(slots=True, kw_only=True)
class ModelResponseReceived(_EventBase):
    type: ClassVar[str] = "model_response"
    text: str | None
    tool_calls: tuple[RecordedCall, ...] = ()
    usage: Usage = field(default_factory=Usage)
    stop_reason: str | None = None
    empty: bool = False
    provider_details: JsonObject = field(default_factory=dict, metadata=OMIT_EMPTY)
    """Vendor data replayed with the turn (reasoning items, thinking signatures); stored only
    when there is some."""
    cost: float | None = None
    """US dollars the call cost, priced from `usage` (keel/pricing.py); None: no known price."""
    took: float | None = field(default=None, metadata=OMIT_EMPTY)
    """Seconds the attempt took, as the loop timed it (what the deadline reserve is estimated
    from, keel.ledger); None in runs recorded before it was kept."""


@dataclass(slots=True, kw_only=True)
class HostedToolCalled(_EventBase):
    """A call the provider ran on its own servers within the turn's model call (a hosted web
    search, ADR 0067), recorded after that turn's response: never approved, never re-run,
    counted in the run's tool calls and priced per call."""

    type: ClassVar[str] = "hosted_tool_call"
    call_id: str
    """The provider's id for the call."""
    name: str
    """The hosted tool: web_search, web_fetch, file_search."""
    input: str
    """What it was asked: the query (queries, one per line) or the URL."""
    sources: tuple[str, ...] = ()
    """The URLs or files it found or read, in the provider's order."""
    error: str | None = field(default=None, metadata=OMIT_EMPTY)
    """The provider's error code; a failed call is not billed."""
    cost: float | None = None
    """US dollars the call cost (keel/pricing.py); None: not billed, or no known price."""


@dataclass(slots=True, kw_only=True)
class ModelErrorSeen(_EventBase):
    type: ClassVar[str] = "model_error"
    status: int | None
    retryable: bool
    message: str
    retry_in: float | None
    """Seconds until the retry, or None when the error ends the turn."""


@dataclass(slots=True, kw_only=True)
class ToolCallRequested(_EventBase):
    type: ClassVar[str] = "tool_call"
    call_id: str
    name: str
    arguments: JsonValue
    """The parsed arguments, or the raw text when it was not valid JSON."""
    call_key: str
    effect: str | None = None
    """The tool's declared effect (read_only, side_effecting, observation); None for an unknown
    tool, and in runs recorded before effects were (`keel replay` then infers it)."""


@dataclass(slots=True, kw_only=True)
class ToolDispatched(_EventBase):
    """The journal entry written before a side effect runs; its result closes it."""

    type: ClassVar[str] = "tool_dispatched"
    call_id: str
    call_key: str
    name: str


@dataclass(slots=True, kw_only=True)
class ToolResultRecorded(_EventBase):
    type: ClassVar[str] = "tool_result"
    call_id: str
    call_key: str
    name: str
    content: str
    """What the model was shown (stored as the event's body)."""
    is_error: bool = False
    size: int = 0
    digest: str = ""
    truncated: bool = False
    uncertain: bool = False
    duration_ms: float = 0.0
    answered_by: str | None = None
    """Who answered the call in place of its tool (a person's "answer instead"): nothing ran,
    `content` is their text."""
    spent: bool | None = field(default=None, metadata=OMIT_EMPTY)
    """The call counted against the tool-call budget: it ran, or was dispatched before a crash
    (keel.ledger); None in runs recorded before it was kept."""
    elided: bool = False
    """Read back only: the result was elided in the last request sent (never written)."""


@dataclass(slots=True, kw_only=True)
class ResultElided(_EventBase):
    type: ClassVar[str] = "result_elided"
    call_id: str
    call_key: str
    size: int
    digest: str


@dataclass(slots=True, kw_only=True)
class ResultClamped(_EventBase):
    """A result of the latest batch shown as its head and tail, to fit the model's window; its
    whole text stays in the record for `read_result` (issue 44)."""

    type: ClassVar[str] = "result_clamped"
    call_id: str
    call_key: str
    size: int
    shown: int
    """Characters shown, pointer included."""


@dataclass(slots=True, kw_only=True)
class ContextShrunk(_EventBase):
    """The provider refused a request as longer than the model's window; the turn is sent
    again from a smaller context (issue 44)."""

    type: ClassVar[str] = "context_shrunk"
    sent: int
    """Tokens the refused request had, as Keel counted them."""
    limit: int
    """The most tokens a request may have from here on, as Keel counts them."""
    window: int | None = None
    """The window the provider said it has, when it said it."""


@dataclass(slots=True, kw_only=True)
class ToolChoiceIgnored(_EventBase):
    """The request insisted on a tool call (tool_choice "required") and the answer has none:
    the server ignored the setting. The run goes on with the answer, and says so (ADR 0036)."""

    type: ClassVar[str] = "tool_choice_ignored"
    requested: str = "required"


@dataclass(slots=True, kw_only=True)
class EvidenceReset(_EventBase):
    """A key's identical-call counter restarted at 1 (keel._run.breaker)."""

    type: ClassVar[str] = "evidence_reset"
    call_key: str
    resets: int
    """Restarts of this kind the key has used."""
    reason: str = "result_changed"
    """"result_changed" (its result differs from the last) or "world_changed" (a side effect
    produced something new since its last call)."""


@dataclass(slots=True, kw_only=True)
class ApprovalRequested(_EventBase):
    type: ClassVar[str] = "approval_requested"
    call_id: str
    name: str
    arguments: JsonValue
    call_key: str
    note: str | None = None
    """Why a person must decide although the tool may be pre-approved (an identical side
    effect earlier in the run ended "effect unknown")."""
    parameters: JsonValue = None
    """The tool's argument schema (JSON Schema), so any process can check edited arguments
    against it before recording them (keel/approvals.py); None for an unknown tool."""
    expires_at: float | None = None
    """Unix time past which the call counts as denied (`Limits.approval_timeout`)."""


@dataclass(slots=True, kw_only=True)
class ApprovalDecided(_EventBase):
    type: ClassVar[str] = "approval_decided"
    call_id: str
    name: str
    call_key: str
    """The key of the call as it was pending: the decision is bound to it (ADR 0052)."""
    approved: bool
    by: str
    reason: str | None = None
    arguments: JsonValue = None
    """Edited arguments the call runs with instead of the model's (None: as asked)."""
    answer: str | None = None
    """The person's text, the call's result in place of the tool's (nothing is run)."""
    for_run: bool = False
    """Later calls of this tool in the run need no approval."""
    expired: bool = False
    """The call's approval timed out: recorded as a denial, whoever came later."""


@dataclass(slots=True, kw_only=True)
class HookApplied(_EventBase):
    """A hook changed the run (keel/hooks.py): what it replaced, denied or ended, so a resume
    replays the change without calling the hook again (ADR 0052)."""

    type: ClassVar[str] = "hook_applied"
    hook: str
    """The hook's class name."""
    point: str
    """before_model_call, after_model_call, before_tool_call or after_tool_call."""
    action: str
    """replace, deny, end_run, or refused (a change the synthesis rule does not allow)."""
    call_id: str | None = None
    detail: JsonValue = None
    """What changed: the new arguments, a denial's or an end's reason, the replaced result's
    size, the response's calls."""


@dataclass(slots=True, kw_only=True)
class OutputRejected(_EventBase):
    """An answer that did not match the run's output schema; the model got `feedback` and
    another turn (keel/structured.py). Replayed on resume, like a turn with calls."""

    type: ClassVar[str] = "output_rejected"
    text: str | None
    """The answer as the model wrote it."""
    feedback: str
    """What the model was told: the validation errors and what to do."""


@dataclass(slots=True, kw_only=True)
class EvidenceRejected(_EventBase):
    """Under `--citations require`, an answer whose quotes or ids did not check against the
    record (keel/citations.py); the model got one more turn with `feedback` as a volatile
    control. Replayed on resume: the answer stays in the history, the control is state."""

    type: ClassVar[str] = "evidence_rejected"
    text: str | None
    feedback: str
    evidence: JsonObject = field(default_factory=dict)


@dataclass(slots=True, kw_only=True)
class RunCompleted(_EventBase):
    type: ClassVar[str] = "run_completed"
    answer: str | None
    synthesized: SynthesisReason | None = None
    cut_off: bool = False
    """The answer stopped at the model's output limit."""
    output: JsonValue = None
    """The validated structured answer, when the run asked for one (keel/structured.py)."""
    partial: bool = False
    """The structured answer came from a synthesis turn: complete as far as `gaps` say."""
    gaps: tuple[str, ...] = ()
    evidence: JsonValue = None
    """The answer checked against the run's results (keel/citations.py); None: not checked."""
    sources: JsonValue = None
    """The pages the answer cites as its provider marked them (ADR 0067), each
    ``{"url", "title", "cited_text"}``; None: none marked."""


@dataclass(slots=True, kw_only=True)
class RunFailed(_EventBase):
    type: ClassVar[str] = "run_failed"
    kind: FailureKind
    message: str
    details: JsonObject = field(default_factory=dict, metadata=FLAT)
    """The counters or budget involved, stored flat beside the other fields (as `keel show
    --json` has always printed them)."""


@dataclass(slots=True, kw_only=True)
class RunCancelled(_EventBase):
    type: ClassVar[str] = "run_cancelled"


@dataclass(slots=True, kw_only=True)
class UnknownEvent(_EventBase):
    """An event of a type this version does not know (written by a newer Keel)."""

    type: ClassVar[str] = "unknown"
    type_name: str
    data: JsonObject


Event: TypeAlias = (
    RunStarted
    | RunResumed
    | ModelRequestSent
    | ModelResponseReceived
    | ModelErrorSeen
    | HostedToolCalled
    | ToolCallRequested
    | ToolDispatched
    | ToolResultRecorded
    | ResultElided
    | ResultClamped
    | ContextShrunk
    | EvidenceReset
    | ToolChoiceIgnored
    | ApprovalRequested
    | ApprovalDecided
    | HookApplied
    | OutputRejected
    | EvidenceRejected
    | RunCompleted
    | RunFailed
    | RunCancelled
    | UnknownEvent
)

_KINDS: dict[str, type[Any]] = {
    cls.type: cls
    for cls in (
        RunStarted,
        RunResumed,
        ModelRequestSent,
        ModelResponseReceived,
        ModelErrorSeen,
        HostedToolCalled,
        ToolCallRequested,
        ToolDispatched,
        ToolResultRecorded,
        ResultElided,
        ResultClamped,
        ContextShrunk,
        EvidenceReset,
        ToolChoiceIgnored,
        ApprovalRequested,
        ApprovalDecided,
        HookApplied,
        OutputRejected,
        EvidenceRejected,
        RunCompleted,
        RunFailed,
        RunCancelled,
    )
}
_NOT_IN_DATA = frozenset({"seq", "at", "content", "elided"})
"""Fields not in an event's JSON: `seq` and `at` have columns of their own, a tool result's
`content` is its body, and `elided` is only ever read back."""


def encode_event(event: Event) -> tuple[str, JsonObject, str | None]:
    """(type, JSON object, body): the one way an event is written."""
    if isinstance(event, UnknownEvent):
        return event.type_name, event.data, None
    encoded = cast(JsonObject, to_json(event))
    data = {k: v for k, v in encoded.items() if k not in _NOT_IN_DATA}
    body = event.content if isinstance(event, ToolResultRecorded) else None
    return event.type, data, body


def decode_event(
    type_name: str, seq: int, at: float, data: JsonObject, body: str | None = None
) -> Event:
    """The one way an event is read back; tolerant of older and newer stores."""
    cls = _KINDS.get(type_name)
    if cls is None:
        return UnknownEvent(type_name=type_name, data=data, seq=seq, at=at, step=_int(data, "step"))
    values: dict[str, Any] = {k: v for k, v in data.items() if k not in _NOT_IN_DATA}
    values.update(seq=seq, at=at)
    if cls is ToolResultRecorded:
        values["content"] = body if body is not None else str(data.get("content", ""))
    try:
        event: Event = from_json(cls, values)
    except TypeError:  # a required field is missing: keep the event, shown raw
        return UnknownEvent(type_name=type_name, data=data, seq=seq, at=at, step=_int(data, "step"))
    return event


def _int(data: JsonObject, key: str) -> int:
    value = data.get(key)
    return value if isinstance(value, int) else 0


# -- the run state ---------------------------------------------------------------------------


@dataclass(slots=True)
class KeyCounter:
    """One call key's identical-call counter, checkpointed per changed key (keel._run.breaker)."""

    count: int = 0
    resets: int = 0
    """Evidence resets already used by this key."""
    last_digest: str | None = None
    """Digest of the key's last successful result (an observation's, under `adr`), to tell
    progress from repetition."""
    world: int = 0
    """The run's world version (`RunState.world`) when this key was last answered: a higher
    version now means a side effect may have changed what this call would see."""
    change_resets: int = 0
    """Restarts because the world changed since this key's last call (policy `progress`)."""


@dataclass(frozen=True, slots=True)
class RepeatState:
    """What the repeat tiers keep besides their counters (keel._run.breaker, docs/adr/0050):
    small and fixed in size. Replaced, never changed in place, so a checkpoint's snapshot is
    never shared with the live run."""

    writes: int = 0
    """Side-effecting calls answered without an error, and calls whose result differed from
    their key's last one, so far: a tier's chain restarts when this moved since its last call
    (something in between may have changed what it sees)."""
    recent_keys: tuple[str, ...] = ()
    """The call keys of the run's last three answered calls, oldest first (alternation)."""
    recent_digests: tuple[str, ...] = ()
    """Their results' digests."""
    alternating: tuple[str, ...] = ("", "")
    """The tier key of the alternation running now with period 2 and with period 3 ("": none)."""


@dataclass(frozen=True, slots=True)
class Decision:
    """A person's decision on one pending call: final once recorded (keel.store.protocol)."""

    approved: bool
    by: str
    reason: str | None = None
    at: float | None = None
    """Unix time it was recorded (its `approval_decided` event's); None in stores written
    before decisions kept it."""
    arguments: JsonValue = None
    """Approved with these arguments instead of the model's (validated against the tool's
    schema before it was recorded); None: as asked."""
    answer: str | None = None
    """Answered instead: this text is the call's result, and nothing is run."""
    for_run: bool = False
    """Approved for the rest of the run: later calls of the tool need no approval."""
    name: str | None = None
    """The tool of the call it was given for; None in stores written before decisions were
    bound to their call."""
    call_key: str | None = None
    """The key (tool and canonical arguments) of the call it was given for: a decision whose
    call no longer matches is refused (ADR 0052)."""
    expired: bool = False
    """A denial because nobody decided before the pause's expiry (`approval_timeout`)."""


@dataclass(frozen=True, slots=True)
class HookChange:
    """A `before_tool_call` hook's decision on one call (keel/hooks.py): replaced arguments,
    a denial, or the end of the run."""

    hook: str
    action: str
    """replace, deny or end_run."""
    arguments: JsonValue = None
    reason: str | None = None


@dataclass(slots=True)
class RunState:
    """What a checkpoint saves besides the counters and elisions: small, fixed-size values.

    Counters live in the breaker and elisions in the context builder; the store saves them per
    changed key beside this, so the bytes written per step do not grow with the run.
    """

    step: int = 0
    model_calls: int = 0
    """Every attempt sent to a provider, retries and synthesis included."""
    tool_calls: int = 0
    usage: Usage = field(default_factory=Usage)
    cost: float | None = None
    """US dollars the run's model calls cost so far; None when its model has no known price
    (or the run was stored before Keel priced calls)."""
    costliest_call: float = 0.0
    """Dollars of the run's costliest model call: the least a next call with no output limit is
    priced at (keel._run.budgets)."""
    status: RunStatus = "running"
    answer: str | None = None
    synthesized: SynthesisReason | None = None
    cut_off: bool = False
    """The answer was cut at the model's output limit."""
    output: JsonValue = None
    """The validated structured answer as JSON, when the run asked for one."""
    partial: bool = False
    """The structured answer came from a synthesis turn (see `gaps`)."""
    gaps: tuple[str, ...] = ()
    """What a synthesized structured answer said it could not establish."""
    output_retries: int = 0
    """Answers rejected by the output schema so far, each given another turn."""
    evidence: JsonValue = None
    """The answer checked against the run's results (keel/citations.py); None: not checked."""
    evidence_retries: int = 0
    """Answers sent back under `--citations require` (at most one per run)."""
    sources: JsonValue = None
    """The pages the answer cites as its provider marked them (ADR 0067); None: none."""
    evidence_feedback: str | None = None
    """The volatile control the next turn carries after such an answer, until it is answered."""
    failure: Failure | None = None
    pending: tuple[PendingApproval, ...] = ()
    waiting: tuple[str, ...] = field(default=(), metadata=OMIT_EMPTY)
    """Child runs queued for the workers that the run waits for (ADR 0069): its status is
    `awaiting_children` until the last of them ends and queues it again."""
    next_seq: int = 0
    """Sequence number of the next event in the run's log."""
    decisions: dict[str, Decision] = field(default_factory=dict)
    """Decisions on pending calls, by Keel's call id (`ToolCall.id`); never replaced."""
    denied: dict[str, Decision] = field(default_factory=dict)
    """Denials by call key, so an identical call is denied again without asking."""
    transport: JsonObject | None = None
    """What a deterministic transport needs to continue where it was (a script's position)."""
    deadline_at: float | None = None
    """Unix time the run must end by: wall-clock from the run's start, across resumes."""
    last_request_tokens: int = 0
    """The input tokens of the run's last request, estimated when it was sent: how much a
    request grows from one turn to the next (a child prices its synthesis turn by it)."""
    answer_owed: bool = False
    """Its children's spend took the run past a budget before it answered: it is owed its
    one synthesis turn (the tree's limit plus one call, ADR 0066), not a BudgetExhausted."""
    longest_model_call: float = 0.0
    """Seconds the run's longest answered model attempt took: what the deadline reserve is
    estimated from (keel._run.budgets), kept across resumes."""
    world: int = 0
    """How often a side-effecting call produced a result the run had not seen from it: the
    world may have changed (loop policy `progress`, keel._run.breaker)."""
    unknown_effects: dict[str, str] = field(default_factory=dict)
    """Side-effecting calls whose effect is unknown (a timeout, a crash, a cancellation): call
    key -> Keel's id of the first such call. An identical call later in the run waits for a
    person, even when its tool is pre-approved (ADR 0033)."""
    children: dict[str, ChildRun] = field(default_factory=dict)
    """Child runs answered so far (sub-agents, ADR 0046), by the parent's call id; the run's
    counters, usage and cost already include what they spent."""
    delegations: int = 0
    """Child runs this run's tree started and answered so far: its own children and what
    each child's tree started (`Limits.max_delegations`, ADR 0066)."""
    approved_for_run: dict[str, Decision] = field(default_factory=dict)
    """Tools a person approved for the rest of this run (`approve --for-run`), by tool name:
    later calls of them need no approval. Never carried to another run."""
    ran_as: dict[str, str] = field(default_factory=dict)
    """Calls that ran with other arguments than the model's (an edit, a hook), by Keel's id:
    the key of what ran, which the loop counters count instead (counted once)."""
    hooked: dict[str, HookChange] = field(default_factory=dict)
    """What a `before_tool_call` hook decided for a call of the open batch, by Keel's id, so a
    resumed batch applies it without asking the hook again."""
    repeats: RepeatState = field(default_factory=RepeatState)
    """The repeat tiers' state besides their counters (docs/adr/0050)."""

    def copy(self) -> RunState:
        """A snapshot later steps cannot change, made from the fields: every container is
        copied (its items are immutable), so a new container field is never shared with the
        live state while a worker thread encodes the snapshot."""
        twin = RunState.__new__(RunState)
        for name in _STATE_FIELDS:
            setattr(twin, name, getattr(self, name))
        for name, make in _CONTAINER_FIELDS:
            setattr(twin, name, make(getattr(self, name)))
        return twin

    def end(self, ending: Ending) -> None:
        """Take the run's ending: each of its fields but the step, by name (a run that ended
        has no other answer, failure or output than its ending's)."""
        for name in _ENDING_FIELDS:
            setattr(self, name, getattr(ending, name))

    def encode(self) -> JsonObject:
        """One codec derived from the fields (keel.codec): a new field needs no edit here."""
        return cast(JsonObject, to_json(self))

    @classmethod
    def decode(cls, data: JsonObject) -> RunState:
        return from_json(cls, data)

    def result(self, run_id: str, conversation_id: str | None = None) -> RunResult:
        return RunResult(
            run_id=run_id,
            conversation_id=conversation_id or run_id,
            status=self.status,
            answer=self.answer,
            synthesized=self.synthesized,
            cut_off=self.cut_off,
            output=self.output,
            partial=self.partial,
            gaps=self.gaps,
            failure=self.failure,
            model_calls=self.model_calls,
            tool_calls=self.tool_calls,
            usage=self.usage,
            cost=self.cost,
            pending_approvals=self.pending,
            children=tuple(self.children.values()),
            evidence=self.evidence if isinstance(self.evidence, dict) else None,
            sources=_sources(self.sources),
        )


def _sources(value: JsonValue) -> tuple[dict[str, str], ...]:
    if not isinstance(value, list):
        return ()
    return tuple({str(k): str(v) for k, v in s.items()} for s in value if isinstance(s, dict))


_STATE_FIELDS = tuple(f.name for f in fields(RunState))
_CONTAINER_FIELDS: tuple[tuple[str, Any], ...] = tuple(
    (f.name, f.default_factory) for f in fields(RunState) if f.default_factory in (dict, list, set)
)
"""The fields holding a mutable container, each with the type that copies it (`copy`)."""


@dataclass(frozen=True, slots=True)
class Ending:
    """How a run ended (or paused), as one value: the stored state takes it (`RunState.end`),
    the result is made from that state, and the closing event is made from it (`event`).
    Each field is the state's field of the same name; the closing event's fields are read from
    it by name, so nothing is copied field by field and a failure is converted once."""

    status: RunStatus
    step: int
    answer: str | None = None
    synthesized: SynthesisReason | None = None
    cut_off: bool = False
    output: JsonValue = None
    partial: bool = False
    """The structured answer came from a synthesis turn: complete as far as `gaps` say."""
    gaps: tuple[str, ...] = ()
    failure: Failure | None = None
    evidence: JsonValue = None
    """The answer checked against the run's results (keel/citations.py); None: not checked."""
    sources: JsonValue = None
    """The pages the answer cites as its provider marked them (ADR 0067); None: none."""

    @classmethod
    def completed(
        cls,
        step: int,
        answer: str | None,
        synthesized: SynthesisReason | None,
        *,
        cut_off: bool = False,
        output: JsonValue = None,
        gaps: tuple[str, ...] = (),
        evidence: JsonValue = None,
        unsupported: bool = False,
        sources: JsonValue = None,
    ) -> Ending:
        """`unsupported`: under `--citations require` the answer still failed its check, so it
        is kept as partial, like a synthesized structured answer."""
        partial = (output is not None and synthesized is not None) or unsupported
        return cls(
            "completed", step, answer, synthesized, cut_off, output, partial, gaps,
            evidence=evidence, sources=sources,
        )  # fmt: skip

    @classmethod
    def failed(cls, error: RunFailure) -> Ending:
        """The one place a run's failure becomes the `Failure` the state and result keep."""
        failure = Failure(error.kind, error.message, error.step, error.details)
        return cls("failed", error.step, failure=failure)

    @classmethod
    def paused(cls, step: int, children: bool = False) -> Ending:
        """`children`: the run waits for child runs the workers run (ADR 0069), not only
        for a person's decision."""
        return cls("awaiting_children" if children else "awaiting_approval", step)

    @classmethod
    def cancelled(cls, step: int) -> Ending:
        return cls("cancelled", step)

    def event(self) -> RunCompleted | RunFailed | RunCancelled | None:
        """The event that records the ending; None for a pause (its approval requests say it)."""
        if self.status == "completed":
            return RunCompleted(**_named(self, RunCompleted))
        if self.status == "failed" and self.failure is not None:
            return RunFailed(**_named(self.failure, RunFailed))
        if self.status == "cancelled":
            return RunCancelled(step=self.step)
        return None


_ENDING_FIELDS = tuple(f.name for f in fields(Ending) if f.name != "step")


def _named(source: Any, event: type[Any]) -> dict[str, Any]:
    """The fields of `event` that the dataclass `source` also has, by name."""
    have = {f.name for f in fields(source)}
    return {f.name: getattr(source, f.name) for f in fields(event) if f.name in have}


# -- the run's settings ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Lineage:
    """Where a run stands among others: the conversation it belongs to and the run it
    continues, or the parent whose call started it (a child)."""

    conversation_id: str | None = None
    continues_from: str | None = None
    parent_run: str | None = None
    parent_call: str | None = None
    agent: str | None = None


@dataclass(frozen=True, slots=True)
class RunConfig:
    """What `keel resume` needs to rebuild a run in another process. Never a secret."""

    model: str
    system_prompt: str
    tools: tuple[str, ...] = ()
    approve_tools: tuple[str, ...] = ()
    limits: Limits = field(default_factory=Limits)
    """The limits the run started with; a resumed run keeps them."""
    settings: JsonObject = field(default_factory=dict, metadata=FLAT)
    """The command line's settings (repo, allowed hosts, writes, base URL, browser) and any
    extra `run_config` a library caller saved with the run; stored flat beside the fields."""
    conversation_id: str | None = field(default=None, metadata=OMIT_EMPTY)
    """The conversation a follow-up belongs to (its first run's id); None: this run starts
    one (a first question, or a fork)."""
    continues_from: str | None = field(default=None, metadata=OMIT_EMPTY)
    """The run whose history this one continues (`keel ask`); None: a first question."""
    parent_run: str | None = field(default=None, metadata=OMIT_EMPTY)
    """A child run's parent (sub-agents, ADR 0046); None: a run of its own."""
    parent_call: str | None = field(default=None, metadata=OMIT_EMPTY)
    """The parent's call (Keel's id) that started this child."""
    agent: str | None = field(default=None, metadata=OMIT_EMPTY)
    """A child's agent name: the delegation tool it was started through."""

    @property
    def lineage(self) -> Lineage:
        return Lineage(
            self.conversation_id, self.continues_from, self.parent_run, self.parent_call, self.agent
        )

    def with_lineage(self, lineage: Lineage) -> RunConfig:
        return replace(
            self,
            conversation_id=lineage.conversation_id,
            continues_from=lineage.continues_from,
            parent_run=lineage.parent_run,
            parent_call=lineage.parent_call,
            agent=lineage.agent,
        )

    def encode(self) -> JsonObject:
        """Derived from the fields (keel.codec): the settings flat at the top level, the
        conversation's ids only when set."""
        return cast(JsonObject, to_json(self))

    @classmethod
    def decode(cls, data: JsonObject) -> RunConfig:
        raw: dict[str, Any] = {"model": "", "system_prompt": "", **data}
        limits = raw.get("limits")
        if isinstance(limits, dict):  # saved before loop policies: it counted as `adr`, and
            before = {f"repeat_{tier}": False for tier in REPEAT_TIERS}  # before the tiers: none
            raw["limits"] = {"loop_policy": "adr", **before, **current_names(limits)}
        return from_json(cls, raw)
