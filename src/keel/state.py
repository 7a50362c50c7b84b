"""The run state a checkpoint saves: small, fixed-size scalars.

Counters live in the breaker and elisions in the context builder; they are saved beside this,
per changed key, so the bytes written per step do not grow with the run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from keel.messages import SynthesisReason, Usage
from keel.result import Failure, PendingApproval, RunResult, RunStatus


@dataclass(slots=True)
class RunState:
    step: int = 0
    model_calls: int = 0
    """Every attempt sent to a provider, retries and synthesis included."""
    tool_calls: int = 0
    usage: Usage = field(default_factory=Usage)
    status: RunStatus = "running"
    answer: str | None = None
    synthesized: SynthesisReason | None = None
    failure: Failure | None = None
    pending: tuple[PendingApproval, ...] = ()
    next_seq: int = 0
    """Sequence number of the next event in the run's log."""
    decisions: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Decisions on pending calls by call id: {"approved", "by", "reason"}."""
    denied: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Denials by call key, so an identical call is denied again without asking."""
    transport: dict[str, Any] | None = None
    """What a deterministic transport needs to continue where it was (a script's position)."""

    def to_dict(self) -> dict[str, Any]:
        failure = self.failure
        return {
            "step": self.step,
            "model_calls": self.model_calls,
            "tool_calls": self.tool_calls,
            "usage": [
                self.usage.input_tokens,
                self.usage.output_tokens,
                self.usage.cached_input_tokens,
            ],
            "status": self.status,
            "answer": self.answer,
            "synthesized": self.synthesized,
            "failure": None
            if failure is None
            else {
                "kind": failure.kind,
                "message": failure.message,
                "step": failure.step,
                "details": failure.details,
            },
            "pending": [pending_dict(p) for p in self.pending],
            "next_seq": self.next_seq,
            "decisions": self.decisions,
            "denied": self.denied,
            "transport": self.transport,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunState:
        failure = data.get("failure")
        return cls(
            step=data["step"],
            model_calls=data["model_calls"],
            tool_calls=data["tool_calls"],
            usage=Usage(*data["usage"]),
            status=data["status"],
            answer=data.get("answer"),
            synthesized=data.get("synthesized"),
            failure=None
            if failure is None
            else Failure(failure["kind"], failure["message"], failure["step"], failure["details"]),
            pending=tuple(PendingApproval(**p) for p in data.get("pending", [])),
            next_seq=data["next_seq"],
            decisions=dict(data.get("decisions", {})),
            denied=dict(data.get("denied", {})),
            transport=data.get("transport"),
        )

    def result(self, run_id: str) -> RunResult:
        return RunResult(
            run_id=run_id,
            status=self.status,
            answer=self.answer,
            synthesized=self.synthesized,
            failure=self.failure,
            model_calls=self.model_calls,
            tool_calls=self.tool_calls,
            usage=self.usage,
            pending_approvals=self.pending,
        )


def pending_dict(p: PendingApproval) -> dict[str, Any]:
    return {"call_id": p.call_id, "name": p.name, "arguments": p.arguments, "call_key": p.call_key}
