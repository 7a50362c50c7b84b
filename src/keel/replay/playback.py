"""A recorded run played through Keel's real run loop: what would the loop rules have done?

The loop is the one every run uses (`keel._run.loop.RunLoop`: the real breaker, counters,
evidence resets, synthesis decision and hard limit), with two stand-ins for the outside world
(and a context that keeps only the question, which is all the stand-in model reads):

    PlaybackModel   asks, turn by turn, for the calls the recording holds; a synthesis-only
                    request (tool_choice "none") is noted and answered with text
    recorded tools  one Keel tool per recorded tool (and effect), answering each call with a
                    text that stands for its recorded result: equal results, equal texts

Each recording is played twice: once as Keel runs it (where the synthesis-only turn would
come, and which key brought it), and once with `Limits.repeat_synthesis` off, to find where
the hard limit alone would have stopped the recording. Nothing is stored (`store=None`).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict, deque
from dataclasses import dataclass, replace
from typing import Any, Literal

import pydantic

from keel._run import NUDGE_PREFIX, ContextBuilder, Listener, RunLoop, RunSetup, tier_of
from keel.errors import ToolError
from keel.limits import REPEAT_TIERS as REPEAT_TIER_NAMES
from keel.limits import Limits, LoopPolicy, RepeatTier
from keel.messages import Item, ModelRequest, ModelResponse, ToolCall, UserMessage
from keel.records import RunConfig
from keel.replay.recordings import Recorded, Recording
from keel.tokens import EstimatingCounter
from keel.tools.base import Effect, Tool
from keel.tools.executor import ToolExecutor

__all__ = ["EFFECT_CHOICES", "Replayed", "effect_of", "replay"]

EffectChoice = Literal["kind", "read_only", "side_effecting"]
EFFECT_CHOICES: tuple[EffectChoice, ...] = ("kind", "read_only", "side_effecting")
"""How a recorded call's effect is chosen when the recording declares none. `kind` (the
default): `read` and `nav` calls only read, every other kind (run, write, submit, other, none
given) may change something; or every call read-only, or every call side-effecting."""

_READING_KINDS = frozenset({"read", "nav"})
_QUESTION = "Replay of a recorded run."


@dataclass(frozen=True, slots=True)
class Replayed:
    """What the loop rules did to one recording."""

    recording: Recording
    synthesis_after: int | None
    """0-based index in `turns` of the turn whose completed batch left a counter at T-1 (the
    next turn would have been synthesis-only), or None."""
    key: str | None
    """The call key that brought the synthesis turn."""
    hard_limit_at: int | None
    """0-based index of the turn whose batch the hard limit would have refused, with no
    synthesis turn before it, or None."""
    hard_key: str | None
    outcome: str
    """How Keel would have ended the run: completed, synthesized (repeated_tool), or a
    failure kind."""
    tiers: tuple[RepeatTier, ...] = ()
    """The repeat tiers in force (docs/adr/0050)."""
    nudge_after: int | None = None
    """0-based index of the turn after which the nudge would have come (with `nudge`)."""
    loops: tuple[tuple[str, int], ...] = ()
    """Each loop the recording holds, by its own definition (`identical` and each tier's),
    with the 0-based turn where its first instance ends: computed from the recording alone,
    whatever rules are in force."""

    @property
    def tier(self) -> str | None:
        """What brought the synthesis turn: `identical`, a tier's name, or None."""
        if self.key is None:
            return None
        return tier_of(self.key) or "identical"

    def caught(self, loop: str) -> bool | None:
        """Whether the synthesis turn came by the end of this loop's first instance; None when
        the recording holds no such loop."""
        for name, end in self.loops:
            if name == loop:
                return self.synthesis_after is not None and self.synthesis_after <= end
        return None

    @property
    def calls_after_synthesis(self) -> int:
        if self.synthesis_after is None:
            return 0
        return sum(len(turn) for turn in self.recording.turns[self.synthesis_after + 1 :])

    @property
    def last_source_write(self) -> int | None:
        writes = [
            i for i, turn in enumerate(self.recording.turns) if any(c.source_write for c in turn)
        ]
        return writes[-1] if writes else None

    @property
    def cut_before_last_write(self) -> bool:
        last = self.last_source_write
        return self.synthesis_after is not None and last is not None and self.synthesis_after < last

    @property
    def back_to_back_loop(self) -> bool:
        """Four or more identical calls with identical results, one turn after another."""
        run, previous = 1, None
        for turn in self.recording.turns:
            current = tuple((c.tool, _frozen(c.arguments), c.result) for c in turn)
            run = run + 1 if current == previous else 1
            if run >= 4:
                return True
            previous = current
        return False

    def to_json(self) -> dict[str, Any]:
        r = self.recording
        return {
            "id": r.id,
            "corpus": r.corpus,
            "model": r.model,
            "resolved": r.resolved,
            "turns": len(r.turns),
            "synthesis_after": self.synthesis_after,
            "key": self.key,
            "hard_limit_at": self.hard_limit_at,
            "hard_key": self.hard_key,
            "calls_after_synthesis": self.calls_after_synthesis,
            "last_source_write": self.last_source_write,
            "cut_before_last_write": self.cut_before_last_write,
            "back_to_back_loop": self.back_to_back_loop,
            "outcome": self.outcome,
            "tiers": list(self.tiers),
            "tier": self.tier,
            "nudge_after": self.nudge_after,
            "loops": {name: end for name, end in self.loops},
        }


def effect_of(call: Recorded, choice: EffectChoice) -> Effect:
    """The recording's own effect where it declares one (Keel's runs), else the choice."""
    if call.effect is not None:
        try:
            return Effect(call.effect)
        except ValueError:
            pass
    if choice == "read_only":
        return Effect.READ_ONLY
    if choice == "side_effecting":
        return Effect.SIDE_EFFECTING
    return Effect.READ_ONLY if call.kind in _READING_KINDS else Effect.SIDE_EFFECTING


async def replay(
    recording: Recording,
    *,
    threshold: int = 5,
    policy: LoopPolicy = "progress",
    effects: EffectChoice = "kind",
    reset_cap: int = 3,
    tiers: tuple[RepeatTier, ...] | None = None,
    nudge: bool = False,
    listeners: tuple[Listener, ...] = (),
) -> Replayed:
    """Play one recording through the run loop, as Keel runs it and with the hard limit alone;
    `listeners` hear both plays' events, as a run's do. `tiers`: the repeat tiers in force;
    None: as the policy has them."""
    chosen: dict[str, Any] = {}
    if tiers is not None:
        chosen = {f"repeat_{tier}": tier in tiers for tier in REPEAT_TIER_NAMES}
    limits = Limits(
        loop_threshold=threshold,
        evidence_reset_cap=reset_cap,
        loop_policy=policy,
        max_model_calls=None,
        max_tool_calls=None,
        model_retries=0,
        nudge=nudge,
        **chosen,
    )
    kept = await _play(recording, limits, effects, listeners)
    hard = await _play(recording, replace(limits, repeat_synthesis=False), effects, listeners)
    return Replayed(
        recording=recording,
        synthesis_after=kept.synthesis_after,
        key=kept.synthesis_key,
        hard_limit_at=hard.refused_at,
        hard_key=hard.refused_key,
        outcome=kept.outcome,
        tiers=limits.repeat_tiers,
        nudge_after=kept.nudge_after,
        loops=recorded_loops(recording),
    )


@dataclass(slots=True)
class _Played:
    synthesis_after: int | None = None
    synthesis_key: str | None = None
    refused_at: int | None = None
    refused_key: str | None = None
    outcome: str = ""
    nudge_after: int | None = None


async def _play(
    recording: Recording, limits: Limits, effects: EffectChoice, listeners: tuple[Listener, ...]
) -> _Played:
    results: dict[str, deque[Recorded]] = defaultdict(deque)
    tools = _tools(recording, effects, results)
    executor = ToolExecutor(list(tools.values()))
    model = PlaybackModel(recording, tools, effects, results)
    context = _QuestionOnly("", executor.definitions, EstimatingCounter(), budget=1_000_000)
    setup = RunSetup(
        transport=model,
        executor=executor,
        limits=limits,
        context=context,
        store=None,
        config=RunConfig(model=model.name, system_prompt="", limits=limits),
        listeners=listeners,
    )
    loop = RunLoop(f"replay-{recording.id}", _QUESTION, setup)
    model.view = loop.view
    result = await loop.run()
    played = _Played(model.synthesis_after, model.synthesis_key, nudge_after=model.nudge_after)
    failure = result.failure
    if failure is not None:
        played.outcome = failure.kind
        details = failure.details
        if failure.kind == "ToolLoopDetected" and "reason" not in details:  # the hard limit
            played.refused_at = model.served - 1
            played.refused_key = str(details.get("call_key"))
    else:
        played.outcome = str(result.synthesized or result.status)
    return played


class _QuestionOnly(ContextBuilder):
    """The replay's context: the loop appends every item as it does to a run's, and only the
    question is kept. The playback model reads no history, and a request copying the whole of
    it each turn made a replay quadratic in its turns (300,000 did not finish in 120 s); the
    loop rules read the counters, never the context."""

    def append(self, item: Item) -> None:
        if isinstance(item, UserMessage):
            super().append(item)


class PlaybackModel:
    """A model that asks for the recorded calls, one recorded turn per model turn."""

    name = "replay"

    def __init__(
        self,
        recording: Recording,
        tools: dict[tuple[str, Effect], Tool],
        effects: EffectChoice,
        results: dict[str, deque[Recorded]],
    ) -> None:
        self.recording = recording
        self.tools = tools
        self.effects = effects
        self.results = results
        self.served = 0
        """Recorded turns handed to the loop so far."""
        self.synthesis_after: int | None = None
        self.synthesis_key: str | None = None
        self.nudge_after: int | None = None
        self.view: Any = None
        """The run's read-only view (`RunLoop.view`): which key brought a synthesis turn."""

    async def request(self, request: ModelRequest) -> ModelResponse:
        if request.tool_choice == "none":  # the loop asks for a synthesis-only turn
            if self.synthesis_after is None:
                self.synthesis_after = self.served - 1
                self.synthesis_key = self.view.repeating_key() if self.view else None
            return ModelResponse("(replay) the synthesis-only turn would come here.")
        nudged = any(note.startswith(NUDGE_PREFIX) for note in request.volatile)
        if nudged and self.nudge_after is None:  # the recording goes on: it never read it
            self.nudge_after = self.served - 1
        if self.served >= len(self.recording.turns):
            return ModelResponse("(replay) the recording ends here.")
        turn = self.recording.turns[self.served]
        self.served += 1
        calls = []
        for n, recorded in enumerate(turn):
            tool = self.tools[(recorded.tool, effect_of(recorded, self.effects))]
            call_id = f"r{self.served}_{n}"
            if isinstance(recorded.arguments, dict):
                call = ToolCall.from_arguments(call_id, tool.name, recorded.arguments)
            else:
                call = ToolCall.from_raw(call_id, tool.name, str(recorded.arguments))
            self.results[call.key].append(recorded)
            calls.append(call)
        await asyncio.sleep(0)
        return ModelResponse(None, tuple(calls))


class _AnyArguments(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="allow")


def _tools(
    recording: Recording, effects: EffectChoice, results: dict[str, deque[Recorded]]
) -> dict[tuple[str, Effect], Tool]:
    """One tool per recorded tool name and effect; a tool seen with two effects (an editor
    that views and writes) becomes two tools, `NAME` and `NAME~EFFECT`."""
    pairs = {(call.tool, effect_of(call, effects)) for turn in recording.turns for call in turn}
    by_name: dict[str, set[Effect]] = defaultdict(set)
    for name, effect in pairs:
        by_name[name].add(effect)
    tools = {}
    for name, effect in sorted(pairs, key=lambda p: (p[0], p[1].value)):
        keel_name = name if len(by_name[name]) == 1 else f"{name}~{effect.value}"
        tools[(name, effect)] = _recorded_tool(keel_name, effect, results)
    return tools


def _recorded_tool(name: str, effect: Effect, results: dict[str, deque[Recorded]]) -> Tool:
    async def answer(arguments: _AnyArguments) -> str:
        key = ToolCall.from_arguments("", name, arguments.model_dump()).key
        queue = results.get(key)
        if not queue:
            return "(replay) no recorded result"
        recorded = queue.popleft()
        if recorded.error:  # an error result, as the recording has it
            raise ToolError(_result_text(recorded))
        return _result_text(recorded)

    return Tool(
        name=name,
        description=f"The recorded tool {name}.",
        args_model=_AnyArguments,
        fn=answer,
        effect=effect,
        pass_model=True,
        parameters={"type": "object"},
    )


def _result_text(call: Recorded) -> str:
    if call.empty:  # an empty result stays empty: the same_result tier counts only others
        return ""
    return f"(replay) result {call.result}" if call.result else "(replay) no result recorded"


LOOP_LENGTH = 4
"""Calls in a row that make a loop of identical calls, of one tool's same result, or of one
tool's same error (the issue's measure: four or more)."""
CYCLES = 3
"""Full cycles that make an alternation a loop."""


def recorded_loops(recording: Recording) -> tuple[tuple[str, int], ...]:
    """The loops a recording holds, each by its own definition, read from the recording
    alone (one call after another, across turns), with the turn where the first ends:

        identical    four or more back-to-back turns with the same calls and results
        same_result  four or more calls in a row of one tool with the same non-empty
                     result, not all with the same arguments
        alternation  three full cycles of two or three distinct calls, each call with the
                     result it had one cycle before
        same_error   four or more calls in a row of one tool failing with the same error,
                     not all with the same arguments
    """
    calls = [
        (t, c, (c.tool, _frozen(c.arguments)))
        for t, turn in enumerate(recording.turns)
        for c in turn
    ]
    found: dict[str, int] = {}
    back = _back_to_back_end(recording)
    if back is not None:
        found["identical"] = back
    for tier, wanted in (("same_result", False), ("same_error", True)):
        start = 0
        for i in range(1, len(calls) + 1):
            if i < len(calls) and _same_run(calls[start][1], calls[i][1], wanted):
                continue
            run = calls[start:i]
            if (
                len(run) >= LOOP_LENGTH
                and _same_run(run[0][1], run[0][1], wanted)
                and len({key for _, _, key in run}) > 1
            ):
                found.setdefault(tier, run[-1][0])
            start = i
    for period in (2, 3):
        length, end = 0, None
        for i in range(period, len(calls)):
            _, call, key = calls[i]
            _, before, before_key = calls[i - period]
            distinct = len({k for _, _, k in calls[i - period + 1 : i + 1]}) == period
            same = key == before_key and (call.result, call.error) == (before.result, before.error)
            if same and distinct and call.result is not None:
                length += 1
                if length >= period * (CYCLES - 1):  # the first cycle, then two more
                    end = calls[i][0]  # the turn where this alternation ends, so far
                continue
            if end is not None:
                break
            length = 0
        if end is not None:
            found.setdefault("alternation", end)
            break
    order = ("identical", "same_result", "alternation", "same_error")
    return tuple((name, found[name]) for name in order if name in found)


def _same_run(first: Recorded, call: Recorded, error: bool) -> bool:
    if call.tool != first.tool or call.result is None or call.result != first.result:
        return False
    if call.error != error or call.error != first.error:
        return False
    return error or not call.empty


def _back_to_back_end(recording: Recording) -> int | None:
    """The turn where the first run of four or more identical turns ends."""
    run, previous, end = 1, None, None
    for t, turn in enumerate(recording.turns):
        current = tuple((c.tool, _frozen(c.arguments), c.result) for c in turn)
        run = run + 1 if current == previous else 1
        if run >= 4:
            end = t
        elif end is not None:
            return end
        previous = current
    return end


def _frozen(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    return value
