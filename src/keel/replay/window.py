"""Where a recorded run would have passed a model's context window (`keel replay --window`).

A recording holds each result's size, not its text, so each request is sized as the run went:
the request that asks for turn i holds the question and every turn before it (the model's text
and calls, each result labelled with its id as the run shows it), counted by the run's own
counter (`EstimatingCounter`) over text of the recorded length. Each turn gets two requests:

    whole   everything as recorded: no result cut, none elided
    kept    what Keel's context builder (the run's own `ContextBuilder`) would send with the
            budget `context_budget(context_tokens, window, MARGIN)` and the window as its hard
            limit: each result cut where a run in that window cuts it (`result_cap`), old
            results elided into pointers once past the budget, and over the window every older
            result elided and the newest batch clamped (ADR 0060); the model's turns stay

A request does not fit when it leaves the answer less than its room: more than the window less
its output limit (`ModelWindow.prompt_room`), which is what ADR 0056 says a request may hold.
Under Keel a kept request that still does not fit after fitting is where the run would answer
from what fits (a context synthesis turn, ADR 0060), so the kept requests are followed up to the
first that does not fit and no further.

The recordings hold no system text, tool definitions or reasoning, and most hold no question:
the sizes are a floor. Text of the recorded length is plain ASCII, one byte a character.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from keel._run import ContextBuilder
from keel.agent import CHARS_PER_TOKEN, RESULTS_PER_WINDOW
from keel.limits import Limits
from keel.messages import AssistantMessage, ToolCall, ToolResult, UserMessage
from keel.replay.recorded import Recorded, Recording
from keel.tokens import MESSAGE_OVERHEAD, EstimatingCounter, TokenCounter, item_tokens
from keel.windows import ModelWindow, context_budget

__all__ = ["MARGIN", "Fit", "WindowCheck", "fit"]

MARGIN = 700
"""Tokens of a request the context builder does not count (chat markers, a tool format's own
text): the margin `keel.agent` keeps below a local model's window (`WINDOW_MARGIN`; a test keeps
the two the same)."""

_CHUNK = 1 << 20
_FILL = "x" * _CHUNK
"""Text standing for recorded text of a known length. A recording may claim any size, so text
is never made longer than this: longer results are counted in pieces of it."""
_PLACEHOLDER = re.compile(r"sha256:[0-9a-f]{16}:(\d{1,12})")
"""How the shared trajectories write a long argument (an edit's text): its digest and length."""


@dataclass(frozen=True, slots=True)
class WindowCheck:
    """A window to hold recordings against, and what Keel's run would keep inside it."""

    window: ModelWindow
    context_tokens: int = field(default_factory=lambda: Limits().context_tokens)
    """The configured context budget (`--context-tokens`), before the window lowers it."""
    max_result_chars: int = field(default_factory=lambda: Limits().max_result_chars)
    """Where the tool executor cuts a result (`--max-result-chars`)."""

    @property
    def limit(self) -> int:
        """The most input tokens a request may hold and still leave the answer its room."""
        return self.window.prompt_room

    @property
    def budget(self) -> int:
        """The context builder's budget in this window (ADR 0056's one formula)."""
        return context_budget(self.context_tokens, self.window, MARGIN)

    @property
    def result_cap(self) -> int:
        """Where a run in this window cuts a result (`keel.agent`: a quarter of the budget,
        in characters, where a window binds; ADR 0060)."""
        quarter = self.budget * CHARS_PER_TOKEN // RESULTS_PER_WINDOW
        return min(self.max_result_chars, max(100, quarter))

    def to_json(self) -> dict[str, Any]:
        return {
            "context": self.window.context,
            "output": self.window.output,
            "limit": self.limit,
            "budget": self.budget,
        }


@dataclass(frozen=True, slots=True)
class Fit:
    """Where one recording's requests would have passed the window."""

    check: WindowCheck
    requests: int
    """Requests the recording implies: one per recorded turn, and the one after the last."""
    largest: int
    """Tokens of the largest request with nothing elided or cut."""
    over_at: int | None
    """0-based index of the turn whose request (everything before it) would not have fit with
    nothing elided; `requests - 1` is the request after the last turn; None: all fit."""
    largest_kept: int
    """Tokens of the largest request Keel's context builder would have sent, up to the first
    that does not fit."""
    kept_over_at: int | None
    """The same as `over_at`, for the requests Keel's context builder would have sent."""
    newest_batch: int | None
    """At `kept_over_at`, tokens of the newest turn (the model's calls and their results), which
    the builder never elides; None when every kept request fits."""
    own_turns: int | None = None
    """At `kept_over_at`, tokens of the model's own turns (its text and calls: an edit's old
    and new text), which the builder never elides either; None when every kept request fits."""
    unsized: int = 0
    """Results whose size the recording does not hold, counted as empty."""

    @property
    def batch_too_big(self) -> bool:
        """The newest batch alone would not have fit: no elision could have helped."""
        return self.newest_batch is not None and self.newest_batch > self.check.limit

    def to_json(self) -> dict[str, Any]:
        return self.check.to_json() | {
            "requests": self.requests,
            "largest": self.largest,
            "over_at": self.over_at,
            "largest_kept": self.largest_kept,
            "kept_over_at": self.kept_over_at,
            "newest_batch": self.newest_batch,
            "newest_batch_too_big": self.batch_too_big,
            "own_turns": self.own_turns,
            "unsized_results": self.unsized,
        }


def fit(recording: Recording, check: WindowCheck) -> Fit:
    """Size each request of the recording, whole and as Keel's context builder keeps it."""
    counter = EstimatingCounter()
    per_chunk = counter.count(_FILL)
    kept = ContextBuilder("", (), counter, budget=check.budget, limit=check.limit)
    kept.append(UserMessage(_FILL[: recording.question_chars]))
    whole = MESSAGE_OVERHEAD + _tokens(counter, per_chunk, "", recording.question_chars)
    largest = largest_kept = 0
    over_at = kept_over_at = newest = own_at = None
    batch = unsized = results = own = 0
    for i in range(len(recording.turns) + 1):
        largest = max(largest, whole)
        if over_at is None and whole > check.limit:
            over_at = i
        if kept_over_at is None:
            shown = kept.total_tokens
            if shown > kept.budget:  # the builder elides and fits when it builds
                shown = kept.build()[0].estimated_input_tokens
            largest_kept = max(largest_kept, shown)
            if shown > check.limit:
                kept_over_at, newest, own_at = i, batch, own
        if i == len(recording.turns):
            break
        text = recording.texts[i] if i < len(recording.texts) else 0
        calls = tuple(_call(f"c{i}_{n}", r) for n, r in enumerate(recording.turns[i]))
        said = AssistantMessage(_FILL[:text] or None, calls)
        spoken = item_tokens(counter, said)
        whole += spoken
        before = kept.total_tokens
        if kept_over_at is None:
            kept.append(said)
            own += spoken
        for call, recorded in zip(calls, recording.turns[i], strict=True):
            results += 1
            chars = recorded.chars or 0
            unsized += recorded.chars is None
            label = f"[r{results}] "
            whole += MESSAGE_OVERHEAD + _tokens(counter, per_chunk, label, chars)
            if kept_over_at is None:
                kept.append(_result(call, recorded, chars, check.result_cap))
        batch = kept.total_tokens - before
    return Fit(
        check,
        requests=len(recording.turns) + 1,
        largest=largest,
        over_at=over_at,
        largest_kept=largest_kept,
        kept_over_at=kept_over_at,
        newest_batch=newest,
        own_turns=own_at,
        unsized=unsized,
    )


def _tokens(counter: TokenCounter, per_chunk: int, prefix: str, chars: int) -> int:
    """Tokens of `prefix` and `chars` characters of text, counted in pieces of at most `_CHUNK`
    characters (a piece counts at most one token more than it would inside a longer text)."""
    pieces, rest = divmod(chars, _CHUNK)
    return pieces * per_chunk + counter.count(prefix + _FILL[:rest])


def _call(call_id: str, recorded: Recorded) -> ToolCall:
    """The call as the model sent it: arguments the recording shortened to a digest and a
    length become text of that length again (at most `_CHUNK` characters)."""
    arguments = _expanded(recorded.arguments)
    if isinstance(arguments, dict):
        return ToolCall.from_arguments(call_id, recorded.tool, arguments)
    return ToolCall.from_raw(call_id, recorded.tool, str(arguments))


def _expanded(value: Any) -> Any:
    if isinstance(value, str):
        found = _PLACEHOLDER.fullmatch(value)
        return _FILL[: int(found.group(1))] if found else value
    if isinstance(value, dict):
        return {key: _expanded(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_expanded(item) for item in value]
    return value


def _result(call: ToolCall, recorded: Recorded, chars: int, cap: int) -> ToolResult:
    """The result as the tool executor shows it: cut past `cap` characters, with its marker."""
    digest = (recorded.result or "")[:16].ljust(16, "0")
    shown = _FILL[: min(chars, cap)]
    if chars > cap:
        shown = (
            f"{shown}\n[truncated: showing {len(shown)} of {chars} characters; full "
            f"result sha256:{digest} kept in the run's store]"
        )
    return ToolResult(
        call.id,
        call.name,
        call.key,
        shown,
        is_error=recorded.error,
        size=chars,
        digest=digest,
        truncated=chars > cap,
    )
