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
from keel._run.recorder import Listener, StepRecorder
from keel.errors import RunFailure
from keel.hooks import Hooks
from keel.hosted import Citation
from keel.limits import Limits
from keel.messages import SynthesisReason
from keel.pricing import Price
from keel.records import RunConfig, RunState
from keel.result import PendingApproval
from keel.store import RunStore
from keel.structured import OutputSpec
from keel.tools.executor import ToolExecutor
from keel.transports.base import Keyed, Resumable, Transport
from keel.transports.streaming import TextListener

__all__ = [
    "Completed",
    "Continue",
    "Failed",
    "Paused",
    "RunSetup",
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
    """The answer's citations checked against the run's results (keel/citations.py); None:
    not checked."""
    unsupported: bool = False
    """Under `--citations require`, the answer still failed its check: kept, partial."""
    sources: tuple[Citation, ...] = ()
    """The pages its provider marked the answer's text as citing (ADR 0067)."""


@dataclass(frozen=True, slots=True)
class Paused:
    """Calls wait for a person's decision, or child runs queued for the workers (ADR 0069)
    are still open; the run pauses durably."""

    pending: tuple[PendingApproval, ...]
    children: bool = False


@dataclass(frozen=True, slots=True)
class Failed:
    failure: RunFailure


StepOutcome = Continue | Completed | Paused | Failed


@dataclass(frozen=True, slots=True)
class RunSetup:
    """Everything a run needs besides its question: the same for a new run and a resumed one."""

    transport: Transport
    executor: ToolExecutor
    limits: Limits
    context: ContextBuilder
    store: RunStore | None
    config: RunConfig
    """What `keel resume` needs to rebuild the run (no secrets)."""
    listeners: tuple[Listener, ...] = ()
    approve_tools: frozenset[str] = frozenset()
    """Tools whose calls are pre-approved for this run."""
    lease_ttl: float = 30.0
    lease_owner: str | None = None
    """A lease the caller already holds on the run (a worker takes it before loading)."""
    price: Price | None = None
    """What the model's calls cost (keel/pricing.py); None: no known price, no cost kept."""
    output: OutputSpec | None = None
    """The shape the answer must have (keel/structured.py); None: free text."""
    text_listeners: tuple[TextListener, ...] = ()
    """Who hears the model's text as it is written (ADR 0039); none: the run does not stream."""
    hooks: Hooks | None = None
    """The application's hooks (keel/hooks.py); None: none."""


@dataclass(slots=True)
class StepParts:
    """What a step works with: the run's setup (held, not copied), its state and the parts
    that act on it."""

    setup: RunSetup
    state: RunState
    breaker: IdenticalCallBreaker
    recorder: StepRecorder
    clock: Clock
    checkpoint: Callable[[], Awaitable[None]]
    """Make the step so far durable (before a side effect, after one)."""
    live: LiveText | None = None
    """Streams each attempt's text to the run's text listeners; None: nobody listens."""
    resumable: Resumable | None = None
    """The transport, when its position is saved with each checkpoint (a script)."""
    keyed: Keyed | None = None
    """The transport, when it sends an API key (scrubbed from its answers, ADR 0048)."""

    def __post_init__(self) -> None:
        transport = self.setup.transport
        if isinstance(transport, Resumable):  # asked once: a protocol check is not free
            self.resumable = transport
        if isinstance(transport, Keyed):  # once per run, not once per answer
            self.keyed = transport

    @property
    def transport(self) -> Transport:
        return self.setup.transport

    @property
    def executor(self) -> ToolExecutor:
        return self.setup.executor

    @property
    def limits(self) -> Limits:
        return self.setup.limits

    @property
    def context(self) -> ContextBuilder:
        return self.setup.context

    @property
    def approve_tools(self) -> frozenset[str]:
        """Tools whose calls are pre-approved for this run."""
        return self.setup.approve_tools

    @property
    def output(self) -> OutputSpec | None:
        """The shape the answer must have (keel/structured.py); None: free text."""
        return self.setup.output

    @property
    def price(self) -> Price | None:
        """What the model's calls cost; None when no price is known (no cost is kept)."""
        return self.setup.price

    @property
    def hooks(self) -> Hooks | None:
        """The application's hooks (keel/hooks.py, ADR 0052); None: none."""
        return self.setup.hooks


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
