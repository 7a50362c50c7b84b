"""Keel's one exception tree.

    KeelError                  base of every error Keel raises on purpose
    ├── ConfigError            misuse: a bad option, limit, model spec or script (exit code 2)
    ├── LeaseHeld              refusal: another live process is advancing that run (exit code 2)
    ├── AlreadyDecided         refusal: that call was decided already; decisions are final
    │   │                      (exit code 2)
    │   └── DecisionExpired    the call's approval timed out first: it was denied
    ├── LeaseLost              this process's lease on a run was taken over: it must stop writing
    ├── ProviderError          one failed model attempt, mapped at the transport boundary;
    │   │                      the gateway retries it or turns it into a ModelError failure
    │   └── ContextOverflow    the provider refused the request as longer than the model's
    │                          context window: never retried as it is, sent again smaller
    ├── RunFailure             why a run failed; carried in RunResult.failure, never lost
    │   ├── ToolLoopDetected   an identical call would reach the threshold, or a tool was
    │   │                      requested in a repeated-tool synthesis turn
    │   ├── BudgetExhausted    model calls, tool calls or tokens ran out
    │   ├── DeadlineExceeded   the run's wall-clock deadline passed
    │   ├── ContextExhausted   not even a synthesis turn fits the model's context window
    │   ├── ModelError         the provider refused, or retries ran out
    │   ├── EmptyModelTurn     a turn's attempts came back empty twice (no text, no tool calls)
    │   ├── InvalidOutput      the answer never matched the run's output schema, not even in a
    │   │                      synthesis turn (the model's text is kept in the details)
    │   ├── RescuesExhausted   workers rescued a stranded run again and again without progress
    │   ├── HookFailed         a hook (keel/hooks.py) raised, timed out or returned nonsense
    │   ├── EndedByHook        a hook ended the run (`keel.EndRun`)
    │   └── StoreUnavailable   the store could not save a step: this process stopped, and the
    │                          run stays at its last saved step, resumable (not saved as failed)
    ├── StoreError             the store could not save or read a run (disk full, file deleted or
    │                          corrupt, a newer schema); what was saved stays saved
    └── ToolError              raised by a tool: its message goes to the model as an error
        │                      result, and the run goes on
        └── EffectUnknown      a side effect that may or may not have happened (its MCP
                               connection was lost mid-call): answered "effect unknown"

Errors fed back to the model (invalid arguments, unknown tools, a tool that raised) are not
failures of the run: they become error results the model reads, and the run goes on. A tool
author raises `ToolError` to say what went wrong in words meant for the model.
Constructors have no side effects; foreign exceptions are mapped once, where they enter.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal, Self

__all__ = [
    "AlreadyDecided",
    "BudgetExhausted",
    "ConfigError",
    "ContextExhausted",
    "ContextOverflow",
    "DeadlineExceeded",
    "DecisionExpired",
    "EffectUnknown",
    "EmptyModelTurn",
    "EndedByHook",
    "FailureKind",
    "HookFailed",
    "InvalidOutput",
    "KeelError",
    "LeaseHeld",
    "LeaseLost",
    "ModelError",
    "ProviderError",
    "RescuesExhausted",
    "RunFailure",
    "StoreError",
    "StoreUnavailable",
    "ToolError",
    "ToolLoopDetected",
]

FailureKind = Literal[
    "ToolLoopDetected",
    "BudgetExhausted",
    "DeadlineExceeded",
    "ContextExhausted",
    "ModelError",
    "EmptyModelTurn",
    "InvalidOutput",
    "StoreUnavailable",
    "RescuesExhausted",
    "HookFailed",
    "EndedByHook",
]


class KeelError(Exception):
    """Base of every error Keel raises on purpose."""


class ConfigError(KeelError):
    """The runtime was misused: the message says what to change."""


class LeaseHeld(KeelError):
    """Another live process is advancing this run: a refusal, like ConfigError (exit code 2)."""


class AlreadyDecided(KeelError):
    """Someone decided that call first: a decision, once recorded, is final (exit code 2). The
    message names who decided, what, and when, so the one who lost a race knows it."""


class DecisionExpired(AlreadyDecided):
    """The call's approval timed out before this decision came: it was recorded as a denial
    (the run goes on as after one), and this decision was not (exit code 2)."""


class LeaseLost(KeelError):
    """This process's lease was taken over (it was presumed dead); it must stop writing."""


class ProviderError(KeelError):
    """One model attempt failed. `retryable` decides between backoff and failing at once."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        retryable: bool = False,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.retryable = retryable
        self.retry_after = retry_after

    def with_message(self, message: str) -> Self:
        """A fresh copy saying `message` instead: the same class and fields, so scrubbing a key
        out of a message or shortening it never turns one kind of error into another. It has
        not been raised, so it has no traceback and nothing chained to it."""
        fresh = type(self).__new__(type(self))
        fresh.__dict__.update(self.__dict__)
        Exception.__init__(fresh, message)
        fresh.message = message
        return fresh


class ContextOverflow(ProviderError):
    """The provider refused the request as longer than the model's context window (OpenAI's
    ``context_length_exceeded``, Anthropic's "prompt is too long", llama.cpp's "exceed context
    window"; keel/transports/overflow.py recognises each wording).

    Not retryable as it is: the same request meets the same window. It is a kind of its own so
    that the run can send the turn again from a smaller context instead of failing.
    `requested` (the tokens the request came to, as the provider counted them) and `limit` (the
    window) are the provider's numbers when its message says them, else None."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        requested: int | None = None,
        limit: int | None = None,
    ) -> None:
        super().__init__(message, status=status, retryable=False)
        self.requested = requested
        self.limit = limit


class RunFailure(KeelError):
    """A run ended without an answer. `details` names the counters or budget involved."""

    kind: ClassVar[FailureKind]

    def __init__(self, message: str, *, step: int, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.step = step
        self.details = details or {}

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "message": self.message, "step": self.step, **self.details}


class ToolLoopDetected(RunFailure):
    kind = "ToolLoopDetected"


class BudgetExhausted(RunFailure):
    kind = "BudgetExhausted"


class DeadlineExceeded(RunFailure):
    kind = "DeadlineExceeded"


class ContextExhausted(RunFailure):
    """Not even a synthesis turn fits the model's window: the question and the model's own
    turns, with every result elided, are longer than it, or the provider refused the turn as
    too long after it was sent again smaller (issue 44). `details` name the window."""

    kind = "ContextExhausted"


class ModelError(RunFailure):
    kind = "ModelError"


class EmptyModelTurn(RunFailure):
    kind = "EmptyModelTurn"


class InvalidOutput(RunFailure):
    """The answer did not validate against the run's output schema after the retries it was
    given, or in a synthesis turn, which has no retry (keel/structured.py)."""

    kind = "InvalidOutput"


class RescuesExhausted(RunFailure):
    """The workers handed a stranded run on `MAX_RESCUES` times in a row without it getting a
    step further (its worker died, or the store refused the same step, every time): it is
    marked failed instead of being taken up again forever (keel/pool/dispatch.py)."""

    kind = "RescuesExhausted"


class HookFailed(RunFailure):
    """A hook (keel/hooks.py) raised, took longer than its timeout, or returned something that
    is not a decision: the step ends here, classified, never a traceback."""

    kind = "HookFailed"


class EndedByHook(RunFailure):
    """A hook returned `keel.EndRun(reason)`: the run ends here with that reason."""

    kind = "EndedByHook"


class StoreUnavailable(RunFailure):
    kind = "StoreUnavailable"


class StoreError(KeelError):
    """The store could not save or read a run (disk full, file deleted or corrupt, a newer
    schema). What was saved before stays saved; the message says what to do."""


class ToolError(KeelError):
    """Raise it from a tool to send its message to the model as an error result; the run goes on.

    The message is all the model sees, so say what went wrong and what to do instead. Keel's
    own tools raise subclasses of it (bad arguments, a page or file that cannot be served).
    """


class EffectUnknown(ToolError):
    """A side-effecting tool cannot tell whether its effect happened (the connection to the
    service that does it was lost mid-call). The call is answered "effect unknown", like a
    side effect interrupted by a crash: the model is told to check, not to repeat it."""
