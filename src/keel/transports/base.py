"""The one interface every model transport implements."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from keel.messages import ModelRequest, ModelResponse


@runtime_checkable
class Transport(Protocol):
    """Speaks one wire protocol. Maps a ModelRequest out and a ModelResponse back.

    Failures are raised as `keel.errors.ProviderError` with `retryable` set; the gateway owns
    retries, timeouts and budgets, so a transport makes exactly one attempt per call.
    """

    name: str
    """A short label for logs and `keel show`, e.g. ``script:demo.json``."""

    async def request(self, request: ModelRequest) -> ModelResponse: ...


@runtime_checkable
class Resumable(Protocol):
    """A transport whose position (a script's next turn) is saved with each checkpoint."""

    def snapshot(self) -> dict[str, Any]: ...

    def restore(self, state: dict[str, Any]) -> None: ...
