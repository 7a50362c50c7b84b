"""What a step works with and what it ends in, below every module that uses them.

`StepParts` holds the run's state and the parts that act on it; the outcomes are the closed set
the loop matches on. `step`, `turns` and `batch` import this module, so none of them needs
another to describe its argument, and the import graph has no circle (docs/design.md, "Where
the code lives").
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from keel._run.breaker import IdenticalCallBreaker
from keel._run.budgets import Clock
from keel._run.context import ContextBuilder
from keel._run.live_text import LiveText
from keel._run.recorder import StepRecorder
from keel.errors import RunFailure
from keel.hooks import Hooks
from keel.limits import Limits
from keel.messages import SynthesisReason
from keel.pricing import Price
from keel.records import RunState
from keel.result import PendingApproval
from keel.structured import OutputSpec
from keel.tools.executor import ToolExecutor
from keel.transports.base import Keyed, Resumable, Transport

__all__ = [
    "Completed",
    "Continue",
    "Failed",
    "Paused",
    "RunView",
    "StepOutcome",
    "StepParts",
]


@dataclass(frozen=True, slots=True)
class Continue:
    """The batch was answered; checkpoint and take the next step."""


@dataclass(frozen=True, slots=True)
class Completed:
    answer: str | None
    synthesized: SynthesisReason | None
    cut_off: bool = False
    """The answer was cut at the model's output limit (kept, and said so)."""
    output: Any = None
    """The validated structured answer as JSON, when the run asked for one."""
    gaps: tuple[str, ...] = ()
    """What a synthesized structured answer said it could not establish."""
    evidence: dict[str, Any] | None = None
    """The answer checked against the run's results (keel/evidence.py); None: not checked."""
    unsupported: bool = False
    """Under `--evidence require`, the answer still failed its check: kept, partial."""


@dataclass(frozen=True, slots=True)
class Paused:
    """Calls wait for a person's decision; the run pauses durably."""

    pending: tuple[PendingApproval, ...]


@dataclass(frozen=True, slots=True)
class Failed:
    failure: RunFailure


StepOutcome = Continue | Completed | Paused | Failed


@dataclass(slots=True)
class StepParts:
    """What a step works with: the run's state and the parts that act on it."""

    state: RunState
    breaker: IdenticalCallBreaker
    context: ContextBuilder
    recorder: StepRecorder
    transport: Transport
    executor: ToolExecutor
    limits: Limits
    clock: Clock
    approve_tools: frozenset[str]
    """Tools whose calls are pre-approved for this run."""
    checkpoint: Callable[[], Awaitable[None]]
    """Make the step so far durable (before a side effect, after one)."""
    output: OutputSpec | None = None
    """The shape the answer must have (keel/structured.py); None: free text."""
    price: Price | None = None
    """What the model's calls cost; None when no price is known (then no cost is kept)."""
    resumable: Resumable | None = None
    """The transport, when its position is saved with each checkpoint (a script)."""
    live: LiveText | None = None
    """Streams each attempt's text to the run's text listeners; None: nobody listens."""
    keyed: Keyed | None = None
    """The transport, when it sends an API key (scrubbed from its answers, ADR 0048)."""
    hooks: Hooks | None = None
    """The application's hooks (keel/hooks.py, ADR 0052); None: none."""

    def __post_init__(self) -> None:
        if isinstance(self.transport, Resumable):  # asked once: a protocol check is not free
            self.resumable = self.transport
        if isinstance(self.transport, Keyed):  # once per run, not once per answer
            self.keyed = self.transport


class RunView:
    """A read-only window on a live run for observers (traces): the step, a key's counter,
    whether a call was denied. Satisfies `keel.telemetry.RunView` without either module
    importing the other."""

    __slots__ = ("_parts", "run_id")

    def __init__(self, run_id: str, parts: StepParts) -> None:
        self.run_id = run_id
        self._parts = parts

    @property
    def step(self) -> int:
        return self._parts.state.step

    def call_count(self, call_key: str) -> int:
        return self._parts.breaker.count(call_key)

    def repeating_key(self) -> str | None:
        """The key that makes the next turn synthesis-only, if one does."""
        return self._parts.breaker.synthesis_key()

    def was_denied(self, call_id: str, call_key: str) -> bool:
        state = self._parts.state
        decision = state.decisions.get(call_id)
        return (decision is not None and not decision.approved) or call_key in state.denied
