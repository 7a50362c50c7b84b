"""The one interface every model transport implements, and the optional capabilities beside it.

`Transport` is all the run loop needs. A transport may also declare a capability, by inheriting
the protocol (so mypy checks the signatures) or simply by having the methods; the runtime asks
with ``isinstance``, never by probing attribute names:

- `Resumable`: its position (a script's next turn) is saved with each step and restored when a
  paused or crashed run resumes in a new process;
- `LocalModel`: it runs a model in this process and can lend the run that model's tokenizer and
  input window, so the context budget matches the real prompt;
- `PinnedSampling`: its sampling settings are fixed and known (the local model's temperature,
  top_p, seed...); the run records them, so `keel show` says how to reproduce it;
- `CountsTokens`: it can lend the run a token counter closer to its prompts than Keel's
  byte estimate, without a window (the XML fallback over a server: `CalibratedCounter`);
- `RemoteServer`: it sends its requests to a server at a known host and port, which traces
  name (``server.address``, ``server.port``); `server_of` finds it under a wrapper too.
- `Priced`: its calls are priced as another spec than its name (a script that names the model
  it stands in for; the XML fallback, as the transport it wraps: keel/pricing.py).
- `SteersFirstCall`: its model needs a required first turn to name the call to start with,
  chosen from the question (the local model's rules, keel/transports/local/steering.py); the
  run core asks it and holds no such rules of its own.

A wrapper (the XML fallback) offers exactly the capabilities of the transport it wraps.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, Literal, Protocol, runtime_checkable

from keel.messages import ModelRequest, ModelResponse
from keel.tokens import TokenCounter

__all__ = [
    "MAX_REPORTED_TOKENS",
    "TOOL_CHOICES",
    "CountsTokens",
    "Keyed",
    "LocalModel",
    "PinnedSampling",
    "Priced",
    "RemoteServer",
    "Resumable",
    "ServerToolChoice",
    "SteersFirstCall",
    "Transport",
    "address_of",
    "server_of",
]

MAX_REPORTED_TOKENS = 10**12
"""The most tokens one count of one response may report. No model's window is within six orders
of magnitude of it, and a run's sums stay far inside SQLite's integers and JSON's exact ones.
Here, not in `wire.py`, so the run core checks counts without importing the wire shapes."""

ServerToolChoice = Literal["auto", "required", "none"]
"""What a provider transport sends as ``tool_choice`` on a turn where Keel itself asks for
nothing (``keel run --tool-choice``): some compatible servers ignore the tools unless it is
sent. A turn that asks (synthesis "none", a first turn's "required") still sends its own."""
TOOL_CHOICES: tuple[ServerToolChoice, ...] = ("auto", "required", "none")


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
    """A transport with a position that a resumed run must continue from.

    The run loop stores `snapshot()` with every checkpoint and, when a run resumes (possibly in
    another process, with a transport built anew from the same model spec), hands it back to
    `restore` before the first request.
    """

    def snapshot(self) -> dict[str, Any]:
        """Where the transport stands, as JSON-serialisable data (it goes into the store)."""
        ...

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from a `snapshot()` taken earlier, by this instance or another."""
        ...


@runtime_checkable
class LocalModel(Protocol):
    """A transport running its model in this process, which can lend the run its tokenizer."""

    @property
    def input_token_limit(self) -> int:
        """The most prompt tokens one request may carry (the window less the output limit)."""
        ...

    def token_counter(self) -> TokenCounter:
        """A counter using the model's own tokenizer; may load the model."""
        ...


@runtime_checkable
class SteersFirstCall(Protocol):
    """A transport whose model follows a call it is shown far better than a rule it is told:
    a first turn that must call a tool names the call (issue 25)."""

    def first_call(self, question: str, tools: Collection[str]) -> str | None:
        """The exact call (``name {arguments}``) to start on what `question` names, among the
        `tools` the run offers; None: the general first-turn control only."""
        ...


@runtime_checkable
class CountsTokens(Protocol):
    """A transport that offers a token counter for its prompts (and no window of its own)."""

    def token_counter(self) -> TokenCounter: ...


@runtime_checkable
class PinnedSampling(Protocol):
    """A transport whose sampling is fixed and known, recorded with every run it serves."""

    @property
    def sampling(self) -> dict[str, float | int]:
        """The settings, as JSON-ready numbers (e.g. temperature, top_p, top_k, seed)."""
        ...


@runtime_checkable
class RemoteServer(Protocol):
    """A transport whose requests go to one server, named in traces (GenAI conventions)."""

    @property
    def server_address(self) -> tuple[str, int]:
        """The server's host and port (the scheme's default when the URL gives none)."""
        ...


class _BaseUrl(Protocol):
    """What `address_of` reads of an SDK client's base URL (httpx's or httpx2's)."""

    @property
    def host(self) -> str: ...
    @property
    def port(self) -> int | None: ...
    @property
    def scheme(self) -> str: ...


def address_of(url: _BaseUrl) -> tuple[str, int]:
    """A base URL's host and port, the scheme's default when it gives none (`RemoteServer`)."""
    return url.host, url.port or (443 if url.scheme == "https" else 80)


def server_of(transport: object) -> tuple[str, int] | None:
    """The host and port `transport` sends to, looking through wrappers (``.inner``); None
    for a model in this process or a script."""
    for _ in range(8):  # wrappers nest a level or two; never loop on a cycle
        if isinstance(transport, RemoteServer):
            return transport.server_address
        transport = getattr(transport, "inner", None)
        if transport is None:
            return None
    return None


@runtime_checkable
class Keyed(Protocol):
    """A transport that sends an API key: the key is scrubbed from everything it answers, as
    from its errors, before the run keeps or shows any of it (SECURITY.md, ADR 0048)."""

    def secret(self) -> str | None:
        """The key this transport sends; None when it sends none (or the placeholder)."""
        ...


@runtime_checkable
class Priced(Protocol):
    """A transport whose calls cost what another spec's cost (keel/pricing.py)."""

    def priced_as(self) -> str:
        """The model spec to price this transport's calls by, e.g. ``openai:gpt-4o``."""
        ...
