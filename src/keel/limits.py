"""Limits of one run: the breaker's threshold, budgets, the deadline, the context budget and the
model's window, and how long one model attempt may take and how much of a provider's error
message is kept."""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, get_args

from keel.errors import ConfigError

__all__ = [
    "CITATION_POLICIES",
    "LOOP_POLICIES",
    "POLICY_TIERS",
    "RENAMED",
    "REPEAT_TIERS",
    "CitationPolicy",
    "Limits",
    "LoopPolicy",
    "RepeatTier",
    "closest_policy",
    "current_names",
]

LoopPolicy = Literal["progress", "adr"]
"""How identical calls are counted (docs/adr/0029). `adr`: every answered identical call
counts, and only observation tools get evidence resets, as the commissioning ADR states it.
`progress` (the default): an identical call restarts its counter when the world may have
changed since its last occurrence (a side effect ran and produced a result not seen before),
or when its own result differs from its last one; both capped per key."""
LOOP_POLICIES: tuple[LoopPolicy, ...] = get_args(LoopPolicy)

CitationPolicy = Literal["off", "report", "require"]
"""What is done with an answer's citations (ADR 0053, ADR 0058). `off`: nothing is checked.
`report` (the default): the check is recorded with the result. `require`: an answer whose
quotes or ids do not check gets one more turn with what failed named; one that still fails is
kept, `partial`, with the failures as its gaps."""
CITATION_POLICIES: tuple[CitationPolicy, ...] = get_args(CitationPolicy)

RepeatTier = Literal["same_result", "alternation", "same_error"]
"""Rules of the loop policy beyond the identical call (docs/adr/0050, keel._run.breaker): other
ways for calls to count as one repeat. `same_result`: calls of one tool with the same result
that says something (not empty, not a success status or fixed success line alone: ADR 0064)
and no side effect in between, whatever their arguments. `alternation`: two or three
calls taking turns with unchanged results. `same_error`: a tool failing with the same error,
whatever its arguments."""
REPEAT_TIERS: tuple[RepeatTier, ...] = get_args(RepeatTier)

POLICY_TIERS: dict[LoopPolicy, tuple[RepeatTier, ...]] = {
    "progress": ("alternation",),
    "adr": (),
}
"""The tiers a policy turns on when the run does not name them (`Limits.repeat_*` None). A
tier is a default only if it held at most 1% resolved runs cut on recordings it was not tuned
on (docs/loop-rules.md, "Calibration"); `same_result` did not (27 of 455 on held-out runs,
issue 47) and is available by name until a held-out set shows it does (docs/adr/0064)."""


def _help(text: str, **extra: str) -> dict[str, str]:
    """A field's command-line help (keel/run_options.py makes each field an option)."""
    return {"help": text, **extra}


@dataclass(frozen=True, slots=True)
class Limits:
    loop_threshold: int = field(default=5, metadata=_help("Identical-call limit T (>= 2)."))
    """T: a call key reaching this many answered calls fails the run (ToolLoopDetected)."""
    evidence_reset_cap: int = field(default=3, metadata=_help("Evidence resets per call key."))
    """R: how often one observation key may restart its counter because the page progressed."""
    max_model_calls: int | None = field(default=50, metadata=_help("Model-call budget."))
    """Every attempt sent to a provider counts, retries and synthesis included."""
    max_tool_calls: int | None = field(default=200, metadata=_help("Tool-call budget."))
    max_tokens: int | None = field(
        default=None, metadata=_help("Input+output token budget.", default_help="none")
    )
    """Input plus output tokens over the whole run, as the provider reports them."""
    max_cost: float | None = field(
        default=None,
        metadata=_help("Cost budget in US dollars, from the price table.", default_help="none"),
    )
    """US dollars over the whole run, priced from the recorded usage (keel/pricing.py). When
    the next call could pass it (as costly as the run's costliest call so far), that call is
    budget synthesis; past it the run fails BudgetExhausted. A model with no known price is
    refused at the start."""
    deadline: float | None = field(
        default=None, metadata=_help("Wall-clock limit in seconds.", default_help="none")
    )
    """Seconds of wall-clock time from the start of the run."""
    deadline_reserve: float | None = field(
        default=None,
        metadata=_help(
            "Seconds kept before --deadline for the final answer.",
            default_help="twice the run's longest model call, at least 1",
        ),
    )
    """Seconds kept before the deadline for one synthesis turn: when less is left, the next
    turn is synthesis-only (reason `deadline`). None (the default) estimates it from the run:
    twice its longest model call so far, at least `keel._run.budgets.DEADLINE_RESERVE_FLOOR`
    (1 s); before the run has timed a call there is nothing to estimate from, and no reserve."""
    context_tokens: int = field(
        default=100_000, metadata=_help("Context budget; older large results are elided past it.")
    )
    """Over this, the oldest large tool results are elided into pointers."""
    context_window: int | None = field(
        default=None,
        metadata=_help(
            "The model's context window in tokens (prompt and answer), for a model Keel's "
            "table does not know, such as an openai-chat: server.",
            default_help="Keel's table, the loaded local model's, else 8192",
        ),
    )
    """Overrides the window Keel knows for the model (keel/windows.py: the shipped table, the
    embedded model's n_ctx, else a conservative 8,192): the context budget stays below it less
    the answer's room. Saved with the run, so a resume keeps it."""
    read_back: bool = field(
        default=True,
        metadata=_help(
            "Offer read_result once a result is elided, truncated or clamped, to read it back "
            "from the record instead of calling its tool again.",
            flag="--read-back/--no-read-back",
        ),
    )
    """The run may read back what it elided or cut (keel/tools/read_back.py, issue 44); off
    only to measure what read-back saves (`keel eval --suite long-runs`)."""
    max_result_chars: int = field(
        default=50_000,
        metadata=_help(
            "Longer tool results are stored whole and shown cut to this many characters."
        ),
    )
    """Longer tool results are stored whole and shown truncated."""
    model_retries: int = field(
        default=4,
        metadata=_help("Retries of a retryable model error (429, 5xx, timeouts) within one turn."),
    )
    """Retries of a retryable model error (429, 5xx, timeouts) within one turn."""
    retry_base_delay: float = field(
        default=0.5,
        metadata=_help("Seconds before the first retry of a model error (doubling, with jitter)."),
    )
    retry_max_delay: float = field(
        default=30.0,
        metadata=_help("Longest wait between two retries of a model error, in seconds."),
    )
    model_timeout: float = field(
        default=600.0,
        metadata=_help(
            "Seconds one model attempt may take in all, or, for the embedded model, go without "
            "a token (retryable past it)."
        ),
    )
    """Seconds one model attempt may take in all, from sending to the last byte of the answer.
    Past it the attempt fails as a retryable timeout; the run's deadline shortens it. The SDKs'
    own timeouts are per read, so without this a server sending a byte now and then holds a run
    for as long as it likes. Ten minutes, the SDKs' own read timeout. For a transport that
    reports its tokens (the embedded model, `keel.transports.liveness`) it measures silence
    instead: no token for this long; and the answer written before such a timeout is kept, cut
    off (issue 39)."""
    max_error_chars: int = field(
        default=2_000, metadata=_help("Characters of a provider's error message that are kept.")
    )
    """A provider's error message is kept to this many characters (events, the failure, the
    terminal); the rest is cut with a note of how much. Bodies past `max_response_bytes` (a
    transport option) are not read at all."""
    loop_policy: LoopPolicy = field(
        default="progress",
        metadata=_help(
            "How identical calls count: progress (a changed world or result restarts a key, "
            "capped) or adr (every identical call counts)."
        ),
    )
    """How identical calls count toward T: "progress" or "adr" (see `LoopPolicy`)."""
    repeat_same_result: bool | None = field(
        default=None,
        metadata=_help(
            "Loop tier same_result: calls of one tool with the same result that says "
            "something (not empty, not a success status alone) and no side effect in between "
            "count as one repeat, whatever their arguments.",
            default_help="as the loop policy has it: off (ADR 0064)",
        ),
    )
    """Tier `same_result` on or off; None: as `loop_policy` has it (`POLICY_TIERS`), decided
    when the limits are made, so the limits saved with a run name each tier on or off and a
    resume keeps them even if a later Keel changes what a policy turns on."""
    repeat_alternation: bool | None = field(
        default=None,
        metadata=_help(
            "Loop tier alternation: two or three calls taking turns with unchanged results "
            "count as one repeat.",
            default_help="as the loop policy has it",
        ),
    )
    """Tier `alternation` on or off; None: as `loop_policy` has it."""
    repeat_same_error: bool | None = field(
        default=None,
        metadata=_help(
            "Loop tier same_error: a tool failing with the same error counts as one repeat, "
            "whatever its arguments.",
            default_help="as the loop policy has it",
        ),
    )
    """Tier `same_error` on or off; None: as `loop_policy` has it."""
    nudge: bool = field(
        default=False,
        metadata=_help(
            "A short note one call before the synthesis turn naming the tool that repeated."
        ),
    )
    """At T-2 (the first repeat a counter or tier sees), the next turn carries a volatile note
    naming the tool whose result came back the same; tools stay offered (docs/adr/0050)."""
    repeat_synthesis: bool = field(default=True, metadata={"cli": False})
    """Give the synthesis-only turn at T-1 (the signature rule). False leaves the hard limit
    alone, as before ADR 0002: only for measurements (`keel replay`'s hard-limit column)."""
    output_retries: int = field(
        default=2,
        metadata=_help(
            "Answers that miss the output schema and get their errors back with one more turn."
        ),
    )
    """Answers that do not match the run's output schema and get their errors back with one
    more turn (each a model call against the budgets); past it the run fails InvalidOutput."""
    max_children: int = field(default=4, metadata=_help("Child runs (sub-agents) at once."))
    """Delegations of one batch that run their children at the same time; the others wait."""
    max_depth: int = field(
        default=2, metadata=_help("Levels of sub-agents below a run (0: it delegates nothing).")
    )
    """How many levels of child runs may hang below this run: a child gets one less (or its
    own, if smaller), and a run at 0 has its delegations answered with why (ADR 0066)."""
    max_delegations: int | None = field(
        default=64,
        metadata=_help("Child runs the whole tree below a run may start."),
    )
    """Children a run's whole tree may start, grandchildren included: shared out like the
    budgets (a child gets part of what is left), so the tree as a whole keeps to it."""
    first_turn_tool: bool | None = field(
        default=None,
        metadata=_help(
            "Insist on evidence: the first turn must call a tool.",
            flag="--first-turn-tool/--no-first-turn-tool",
            default_help="on for the local model, off for others",
        ),
    )
    """Insist on evidence first: the run's first turn asks for a tool call (tool_choice
    "required") instead of letting the model answer at once. Synthesis turns win over it."""

    approval_timeout: float | None = field(
        default=None,
        metadata=_help(
            "Seconds a paused call waits for a decision; past it, it is denied.",
            default_help="none",
        ),
    )
    """Seconds a call waiting for approval may wait: past it the call is denied with that
    reason (also when the approver comes later), and the run goes on as after a denial."""

    citations: CitationPolicy = field(
        default="report",
        metadata=_help(
            "Answers' citations checked against the run's results: off, report (recorded with "
            "the result) or require (one more turn to fix what failed, then kept as partial)."
        ),
    )
    """What is done with an answer's citations and quotes (see `CitationPolicy`). Named
    `evidence` before ADR 0058, a name the breaker's evidence resets (ADR 0003) also had."""

    def __post_init__(self) -> None:
        timeout = self.approval_timeout
        if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
            raise ConfigError(
                f"approval timeout must be a positive number of seconds (got {timeout})"
            )
        if self.loop_threshold < 2:
            raise ConfigError(
                f"loop threshold must be at least 2 (got {self.loop_threshold}): at 1 the very "
                "first call of every tool would already count as a loop"
            )
        if self.evidence_reset_cap < 0:
            raise ConfigError("evidence reset cap must be 0 or more")
        for name in ("max_model_calls", "max_tool_calls", "max_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{name.replace('_', ' ')} must be at least 1 (got {value})")
        if self.max_cost is not None and not (math.isfinite(self.max_cost) and self.max_cost > 0):
            raise ConfigError(
                f"max cost must be a positive number of dollars (got {self.max_cost})"
            )
        if self.deadline is not None and not (math.isfinite(self.deadline) and self.deadline > 0):
            raise ConfigError(
                f"deadline must be a positive number of seconds (got {self.deadline})"
            )
        reserve = self.deadline_reserve
        if reserve is not None and not (math.isfinite(reserve) and reserve >= 0):
            raise ConfigError(f"deadline reserve must be 0 or more seconds (got {reserve})")
        if self.context_tokens < 256:
            raise ConfigError(f"context tokens must be at least 256 (got {self.context_tokens})")
        if self.context_window is not None and self.context_window < 1024:
            raise ConfigError(
                f"context window must be at least 1024 tokens (got {self.context_window}): "
                "no model worth running has a smaller one"
            )
        if self.max_result_chars < 100:
            raise ConfigError("max result chars must be at least 100")
        if self.loop_policy not in LOOP_POLICIES:
            raise ConfigError(
                f"loop policy must be one of {', '.join(LOOP_POLICIES)} (got {self.loop_policy!r})"
                + closest_policy(self.loop_policy)
            )
        for tier in REPEAT_TIERS:  # decided once, so a run saves the tiers it ran with
            if getattr(self, f"repeat_{tier}") is None:
                object.__setattr__(self, f"repeat_{tier}", tier in POLICY_TIERS[self.loop_policy])
        if self.citations not in CITATION_POLICIES:
            raise ConfigError(
                f"citations must be one of {', '.join(CITATION_POLICIES)} "
                f"(got {self.citations!r})" + closest_policy(self.citations, CITATION_POLICIES)
            )
        if self.max_depth < 0:
            raise ConfigError(f"max depth must be 0 or more (got {self.max_depth})")
        if self.max_delegations is not None and self.max_delegations < 0:
            raise ConfigError(f"max delegations must be 0 or more (got {self.max_delegations})")
        if self.max_children < 1:
            raise ConfigError(f"max children must be at least 1 (got {self.max_children})")
        if self.output_retries < 0:
            raise ConfigError("output retries must be 0 or more")
        if self.model_retries < 0:
            raise ConfigError("model retries must be 0 or more")
        for name in ("retry_base_delay", "retry_max_delay"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"{name.replace('_', ' ')} must be 0 or more (got {value})")
        if not (math.isfinite(self.model_timeout) and self.model_timeout > 0):
            raise ConfigError(
                f"model timeout must be a positive number of seconds (got {self.model_timeout})"
            )
        if self.max_error_chars < 100:
            raise ConfigError(f"max error chars must be at least 100 (got {self.max_error_chars})")

    @property
    def repeat_tiers(self) -> tuple[RepeatTier, ...]:
        """The tiers in force (each decided when the limits were made)."""
        return tuple(tier for tier in REPEAT_TIERS if getattr(self, f"repeat_{tier}"))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


RENAMED: dict[str, str] = {"evidence": "citations"}
"""Former names of `Limits` fields, each with the name it has now (ADR 0058): a run stored
before the rename, a keel.toml, a scenario file or a sub-agent's table may still hold one."""


def current_names(values: Mapping[str, Any]) -> dict[str, Any]:
    """`values` (a stored or written `Limits` table) with each former field name read as the
    current one; the current name wins when a table holds both."""
    found = dict(values)
    for old, new in RENAMED.items():
        if old in found:
            value = found.pop(old)
            found.setdefault(new, value)
    return found


def closest_policy(name: object, choices: tuple[str, ...] = LOOP_POLICIES) -> str:
    """ "; did you mean 'progress'?" for `prog`, as keel.toml keys get; empty when none is close."""
    close = difflib.get_close_matches(str(name), choices, n=1, cutoff=0.4)
    return f"; did you mean {close[0]!r}?" if close else ""
