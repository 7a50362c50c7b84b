"""Decisions on paused runs: who approved or denied which call, recorded in the store.

A paused run holds no lease and no process; any process may record a decision, and `resume`
(in any process) acts on it. Calls are named by Keel's own call id (`k<step>_<n>`, ADR 0030),
never by the id the model's provider gave them. A decision is final: the store refuses a second
one on the same call with AlreadyDecided, naming who decided what and when.
"""

from __future__ import annotations

import getpass

from keel.errors import ConfigError
from keel.result import PendingApproval
from keel.store import RunStore

__all__ = ["approve", "deny", "pending", "who"]


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
    store: RunStore, run_id: str, call_id: str | None = None, by: str | None = None
) -> list[str]:
    """Approve one pending call, or all of them when `call_id` is None."""
    ids = [p.call_id for p in pending(store, run_id)] if call_id is None else [call_id]
    for one in ids:
        _decide(store, run_id, one, True, by or who(), None)
    return ids


def deny(store: RunStore, run_id: str, call_id: str, reason: str, by: str | None = None) -> None:
    _decide(store, run_id, call_id, False, by or who(), reason)


def _decide(
    store: RunStore, run_id: str, call_id: str, approved: bool, by: str, reason: str | None
) -> None:
    """A decision on a child's call (``CHILD_RUN:CALL_ID``, sub-agents) is the child's: it is
    taken there first (and on down, for a grandchild's), then noted on this run, so its
    pending list says it was decided; the parent's resume resumes the child."""
    record = store.get_run(run_id)
    asked = {p.call_id: p for p in record.state.pending} if record is not None else {}
    child = asked[call_id].run_id if call_id in asked else None
    if child is not None:
        inner = call_id.removeprefix(f"{child}:")
        _decide(store, child, inner, approved, by, reason)
    store.decide(run_id, call_id, approved=approved, by=by, reason=reason)
