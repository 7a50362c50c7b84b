"""Decisions on paused runs: who approved, edited, answered or denied which call, in the store.

A paused run holds no lease and no process; any process may record a decision, and `resume`
(in any process) acts on it. Calls are named by Keel's own call id (`k<step>_<n>`, ADR 0030),
never by the id the model's provider gave them. A decision is final: the store refuses a second
one on the same call with AlreadyDecided, naming who decided what and when.

The four decisions (ADR 0052), each bound to the pending call it was given for (its tool and
canonical arguments, recorded with it):

- approve, as asked or with edited arguments (`arguments=`: the whole new arguments, checked
  against the tool's schema before anything is recorded; the tool receives them, and the loop
  counters count the key of what ran);
- approve for the rest of the run (`for_run=True`): later calls of the tool need no approval;
- answer instead (`answer`): the person's text is the call's result, nothing runs;
- deny, with a reason the model is told.

Past a pause's expiry (`Limits.approval_timeout`) a decision is refused with DecisionExpired
and the denial the call turned into is recorded instead.

Edited arguments are a person's (or a protocol client's) JSON checked against a schema Keel did
not write, so they go through the one bounded path for such schemas (keel/schema_checks.py,
ADR 0062): at most 64 levels deep, the recorded schema checked before it is used (nothing
fetched), RE2 patterns, and the whole check, the tool's own included, in a daemon thread cut
off at VALIDATION_SECONDS. Servers call `check` and `decide` off their event loop.
"""

from __future__ import annotations

import getpass
from collections.abc import Callable
from typing import Any

from keel.canonical import call_key
from keel.errors import AlreadyDecided, ConfigError, DecisionExpired
from keel.records import ApprovalDecided, ApprovalRequested, Decision, JsonValue
from keel.result import PendingApproval
from keel.schema_checks import (
    MAX_VALUE_DEPTH,
    VALIDATION_SECONDS,
    ValidationTooCostly,
    checked_validator,
    in_thread,
    validation_errors,
    value_depth,
)
from keel.store import RunStore
from keel.store.protocol import already_decided

__all__ = ["answer", "approve", "check", "decide", "deny", "pending", "who"]

Validator = Callable[[str, Any], None]
"""Checks edited arguments for a tool by its name (raises ConfigError when they do not fit)."""


def who() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "a person"


def pending(store: RunStore, run_id: str) -> tuple[PendingApproval, ...]:
    """Calls of a paused run still waiting for a decision."""
    record = store.get_run(run_id)
    if record is None:
        raise ConfigError(f"no run {run_id} in {store.path}")
    decided = record.state.decisions
    return tuple(p for p in record.state.pending if p.call_id not in decided)


def approve(
    store: RunStore,
    run_id: str,
    call_id: str | None = None,
    by: str | None = None,
    *,
    arguments: Any = None,
    for_run: bool = False,
    validate: Validator | None = None,
) -> list[str]:
    """Approve one pending call, or all of them when `call_id` is None; `arguments`: the
    whole edited arguments of the one call; `for_run`: also every later call of its tool."""
    if call_id is None and arguments is not None:
        raise ConfigError("edited arguments are for one call: name the call")
    ids = [p.call_id for p in pending(store, run_id)] if call_id is None else [call_id]
    for one in ids:
        decision = Decision(True, by or who(), arguments=arguments, for_run=for_run)
        decide(store, run_id, one, decision, validate=validate)
    return ids


def deny(store: RunStore, run_id: str, call_id: str, reason: str, by: str | None = None) -> None:
    decide(store, run_id, call_id, Decision(False, by or who(), reason))


def answer(
    store: RunStore, run_id: str, call_id: str, text: str, by: str | None = None
) -> None:
    """Answer the call in place of its tool: `text` is its result, nothing runs."""
    if not text.strip():
        raise ConfigError("the answer is empty: say what the call's result should be")
    decide(store, run_id, call_id, Decision(False, by or who(), answer=text))


def decide(
    store: RunStore,
    run_id: str,
    call_id: str,
    decision: Decision,
    *,
    expect_key: str | None = None,
    validate: Validator | None = None,
) -> ApprovalDecided:
    """Record `decision` on one pending call. `expect_key`: the key of the call the decider
    saw (a form, a protocol message); a pending call with another key is refused, nothing
    recorded. Raises ConfigError (no such pending call, edited arguments that do not fit the
    tool's schema), AlreadyDecided (decided before), DecisionExpired (its approval timed
    out: the denial is what was recorded).

    A decision on a child's call (``CHILD_RUN:CALL_ID``, sub-agents) is the child's: it is
    taken there first (and on down, for a grandchild's), then noted on this run, so its
    pending list says it was decided; the parent's resume resumes the child."""
    record = store.get_run(run_id)
    if record is None:
        raise ConfigError(f"no run {run_id} in {store.path}")
    asked = {p.call_id: p for p in record.state.pending}
    earlier = record.state.decisions.get(call_id)
    if earlier is not None:  # said before any check, as the store would say it
        raise _refusal(run_id, call_id, earlier)
    child = asked[call_id].run_id if call_id in asked else None
    expired: DecisionExpired | None = None
    if child is not None:
        inner = call_id.removeprefix(f"{child}:")
        try:
            decide(store, child, inner, decision, expect_key=expect_key)  # its own tools
        except DecisionExpired as passed:  # the child recorded the denial: so does this run
            expired = passed
    elif call_id in asked and decision.arguments is not None:
        check_arguments(store, run_id, asked[call_id], decision.arguments, validate)
    event = store.decide(
        run_id,
        call_id,
        approved=decision.approved,
        by=decision.by,
        reason=decision.reason,
        detail=decision,
        expect_key=expect_key,
    )
    if expired is not None:
        raise expired
    if event.expired:
        denial = Decision(False, event.by, event.reason, at=event.at, expired=True)
        raise _refusal(run_id, call_id, denial)
    return event


def check(
    store: RunStore,
    run_id: str,
    call_id: str,
    decision: Decision,
    *,
    expect_key: str | None = None,
    validate: Validator | None = None,
) -> None:
    """What `decide` would refuse, without recording anything: a call that is not pending,
    one decided before, another call than the one seen (`expect_key`), edited arguments that
    do not fit. For protocols that record several decisions all or none."""
    record = store.get_run(run_id)
    if record is None:
        raise ConfigError(f"no run {run_id} in {store.path}")
    earlier = record.state.decisions.get(call_id)
    if earlier is not None:
        raise _refusal(run_id, call_id, earlier)
    asked = {p.call_id: p for p in record.state.pending}
    if record.status != "awaiting_approval" or call_id not in asked:
        raise ConfigError(f"{call_id} is not a call of run {run_id} that waits for a decision")
    call = asked[call_id]
    if expect_key is not None and expect_key != call.call_key:
        raise ConfigError(
            f"{call_id} waits as {call.call_key[:200]}, not as the call decided on "
            f"({expect_key[:200]}); nothing was recorded"
        )
    if call.run_id is not None:
        inner = call_id.removeprefix(f"{call.run_id}:")
        check(store, call.run_id, inner, decision, expect_key=expect_key)
    elif decision.arguments is not None:
        check_arguments(store, run_id, call, decision.arguments, validate)


def _refusal(run_id: str, call_id: str, earlier: Decision) -> AlreadyDecided:
    """What the one who came too late is told: DecisionExpired when the call's approval had
    timed out (a denial was recorded for it), else AlreadyDecided."""
    text = already_decided(run_id, call_id, earlier)
    return DecisionExpired(text) if earlier.expired else AlreadyDecided(text)


def check_arguments(
    store: RunStore,
    run_id: str,
    call: PendingApproval,
    arguments: JsonValue,
    validate: Validator | None = None,
) -> str:
    """Edited arguments for `call`, checked against its tool's schema (the one recorded when
    it was asked, and the tool's own when `validate` can reach it); their call key. Raises
    ConfigError saying what does not fit."""
    if not isinstance(arguments, dict):
        raise ConfigError(
            f"the edited arguments of {call.call_id} must be a JSON object (the whole "
            f"arguments of {call.name}), not {type(arguments).__name__}"
        )
    if value_depth(arguments, MAX_VALUE_DEPTH) > MAX_VALUE_DEPTH:
        raise ConfigError(
            f"the edited arguments of {call.call_id} are nested more than {MAX_VALUE_DEPTH} "
            "levels deep; nothing was recorded"
        )
    schema = _recorded_schema(store, run_id, call.call_id)

    def work() -> None:
        if isinstance(schema, dict):
            _fits(call.name, schema, arguments)
        if validate is not None:
            validate(call.name, arguments)

    try:
        in_thread(work, VALIDATION_SECONDS)
    except ValidationTooCostly:
        raise ConfigError(
            f"checking the edited arguments against {call.name}'s schema took over "
            f"{VALIDATION_SECONDS:g}s; nothing was recorded"
        ) from None
    return call_key(call.name, arguments)


def _fits(name: str, schema: dict[str, Any], arguments: JsonValue) -> None:
    """Edited arguments against the schema recorded with the call (ConfigError when they do
    not fit); a recorded schema Keel would not use (one with a $ref outside it, a pattern RE2
    cannot take, not a JSON Schema) is left to the tool's own check."""
    try:
        validator = checked_validator(schema, f"{name}'s schema")
    except ConfigError:
        return
    errors = validation_errors(validator, arguments)
    if errors:
        invalid = errors[0]
        where = "/".join(str(p) for p in invalid.absolute_path) or "the arguments"
        raise ConfigError(
            f"the edited arguments do not fit {name}'s schema ({where}: "
            f"{invalid.message}); nothing was recorded"
        )


def _recorded_schema(store: RunStore, run_id: str, call_id: str) -> JsonValue:
    for event in reversed(store.events(run_id)):
        if isinstance(event, ApprovalRequested) and event.call_id == call_id:
            return event.parameters
    return None
