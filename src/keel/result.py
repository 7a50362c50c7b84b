"""What a run ends with: the library's RunResult and the command line's JSON are the same."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import pydantic

from keel.errors import FailureKind
from keel.messages import SynthesisReason, Usage

__all__ = [
    "BUSY",
    "LIVE",
    "OVER",
    "STATUSES",
    "TERMINAL",
    "ChildRun",
    "Failure",
    "PendingApproval",
    "RunResult",
    "RunStatus",
]

RunStatus = Literal[
    "queued",
    "running",
    "awaiting_approval",
    "awaiting_children",
    "completed",
    "failed",
    "cancelled",
]
"""`queued`: submitted to the workers (`keel submit`), not started yet (or a parent whose
children have all ended, queued again). `awaiting_children`: a parent on a Postgres store whose
children run as queued runs of their own; it holds no worker until the last of them ends
(ADR 0069)."""

# The sets of statuses, defined here only; every reader names one of them.
STATUSES: tuple[RunStatus, ...] = get_args(RunStatus)
"""Every status, in the order lists show them (the runs page's filter, `keel runs --status`)."""
LIVE: tuple[RunStatus, ...] = ("queued", "running", "awaiting_approval", "awaiting_children")
"""Runs that may still change: a process advances them, or will once a person decides (a run's
page follows one). Every other status is in `TERMINAL`."""
BUSY: tuple[RunStatus, ...] = ("queued", "running", "awaiting_children")
"""Runs that will go on without a person: a parent waiting for its queued children waits for
those in one of these (ADR 0069); a child that ended or stopped for a decision is not one."""
OVER: tuple[RunStatus, ...] = ("completed", "failed")
"""Runs that are over: nothing resumes them; a follow-up question may continue one, and a
child run found over is read, not run again."""
TERMINAL: tuple[RunStatus, ...] = (*OVER, "cancelled")
"""Runs no process advances and none takes up by itself (workers leave them alone; A2A calls
them terminal): `OVER`, and `cancelled`, a run interrupted (Ctrl-C, a cancelled task) that a
person may still resume."""


@dataclass(frozen=True, slots=True)
class Failure:
    """Why a run failed, with the step and the counters or budget involved."""

    kind: FailureKind
    message: str
    step: int
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "message": self.message}


@dataclass(frozen=True, slots=True)
class PendingApproval:
    call_id: str
    name: str
    arguments: Any
    call_key: str
    note: str | None = None
    """What the approver must know beyond the call itself: an identical side effect earlier in
    the run ended "effect unknown", so it may have happened already."""
    run_id: str | None = None
    """The child run that asked (sub-agents, ADR 0046); None: this run's own call. A parent
    shows its children's pending calls under ids of the form ``CHILD_RUN:CALL_ID``."""
    expires_at: float | None = None
    """Unix time past which the call counts as denied (`Limits.approval_timeout`); None: the
    pause waits for as long as it takes."""


@dataclass(frozen=True, slots=True)
class ChildRun:
    """A child run its parent delegated a task to (sub-agents, ADR 0046), as the parent keeps
    it: who it is, how it ended, and what it spent (the parent's totals include it)."""

    run_id: str
    call_id: str
    """The parent's call (Keel's id) that started the child."""
    agent: str
    """The delegation tool's name: which child agent it was."""
    status: RunStatus = "running"
    synthesized: SynthesisReason | None = None
    model_calls: int = 0
    tool_calls: int = 0
    usage: Usage = field(default_factory=Usage)
    cost: float | None = None
    delegations: int = 0
    """Child runs the child's own tree started (its children, theirs, ...)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "call_id": self.call_id,
            "agent": self.agent,
            "status": self.status,
            "synthesized": self.synthesized,
            "model_calls": self.model_calls,
            "tool_calls": self.tool_calls,
            "usage": {
                "input_tokens": self.usage.input_tokens,
                "output_tokens": self.usage.output_tokens,
            },
            "cost_usd": self.cost,
        }


@dataclass(frozen=True, slots=True)
class RunResult:
    run_id: str
    status: RunStatus
    answer: str | None
    synthesized: SynthesisReason | None
    failure: Failure | None
    model_calls: int
    tool_calls: int
    usage: Usage
    pending_approvals: tuple[PendingApproval, ...] = ()
    cost: float | None = None
    """US dollars the run's model calls cost (keel/pricing.py); None: its model has no known
    price. Local and scripted models cost 0."""
    cut_off: bool = False
    """The answer stopped at the model's output-token limit: complete as far as it goes."""
    output: Any = None
    """The validated structured answer, when the run asked for one (`Agent(output_type=...)`):
    an instance of the pydantic model, or JSON for a JSON Schema; None otherwise."""
    partial: bool = False
    """`output` came from a synthesis turn (a limit was reached): see `gaps`."""
    gaps: tuple[str, ...] = ()
    """What a partial answer said it could not establish."""
    conversation_id: str | None = None
    """The conversation the run belongs to (its first run's id): ask a follow-up with
    ``agent.run(question, conversation=...)`` or ``keel ask``."""
    children: tuple[ChildRun, ...] = ()
    """The child runs this run delegated to, in the order they were answered; its counters
    and cost include theirs."""
    forked_from: dict[str, Any] | None = None
    """Where a fork branched (ADR 0051): {"run_id", "step"} of the run it copied its first
    steps from, or {"recording", "id", "step"}; None: not a fork."""
    evidence: dict[str, Any] | None = None
    """The answer checked against the run's results (ADR 0053): cited ids, quotes checked and
    failed, uncited sentences, unknown ids, the paths and URLs it names; None: not checked."""

    sources: tuple[dict[str, str], ...] = ()
    """The pages the answer's text cites as its provider marked them (a hosted search's
    citations, ADR 0067): each ``{"url", "title", "cited_text"}``; empty: none marked."""

    @property
    def ok(self) -> bool:
        return self.status == "completed"

    def to_dict(self) -> dict[str, Any]:
        """The `keel run --json` object; a parent's also lists its `children`."""
        shown = {
            "run_id": self.run_id,
            "conversation_id": self.conversation_id or self.run_id,
            "status": self.status,
            "answer": self.answer,
            "synthesized": self.synthesized,
            "cut_off": self.cut_off,
            "failure": self.failure.to_dict() if self.failure else None,
            "model_calls": self.model_calls,
            "tool_calls": self.tool_calls,
            "usage": {
                "input_tokens": self.usage.input_tokens,
                "output_tokens": self.usage.output_tokens,
            },
            "cost_usd": self.cost,
            "output": _json_output(self.output),
            "partial": self.partial,
            "gaps": list(self.gaps),
            "pending_approvals": [
                {"call_id": p.call_id, "name": p.name, "arguments": p.arguments}
                | ({"note": p.note} if p.note else {})
                | ({"child_run": p.run_id} if p.run_id else {})
                | ({"expires_at": p.expires_at} if p.expires_at is not None else {})
                for p in self.pending_approvals
            ],
        }
        if self.evidence is not None:
            shown["evidence"] = self.evidence
        if self.sources:
            shown["sources"] = [dict(s) for s in self.sources]
        if self.children:
            shown["children"] = [c.to_dict() for c in self.children]
        if self.forked_from is not None:
            shown["forked_from"] = self.forked_from
        return shown


def _json_output(output: Any) -> Any:
    """A pydantic model as its JSON; JSON as it is."""
    return output.model_dump(mode="json") if isinstance(output, pydantic.BaseModel) else output
