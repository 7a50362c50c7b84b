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

from keel._run.context import ContextBuilder
from keel._run.loop import RunLoop, RunSetup
from keel._run.recorder import Listener
from keel.limits import Limits, LoopPolicy
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
    listeners: tuple[Listener, ...] = (),
) -> Replayed:
    """Play one recording through the run loop, as Keel runs it and with the hard limit alone;
    `listeners` hear both plays' events, as a run's do."""
    limits = Limits(
        loop_threshold=threshold,
        evidence_reset_cap=reset_cap,
        loop_policy=policy,
        max_model_calls=None,
        max_tool_calls=None,
        model_retries=0,
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
    )


@dataclass(slots=True)
class _Played:
    synthesis_after: int | None = None
    synthesis_key: str | None = None
    refused_at: int | None = None
    refused_key: str | None = None
    outcome: str = ""


async def _play(
    recording: Recording, limits: Limits, effects: EffectChoice, listeners: tuple[Listener, ...]
) -> _Played:
    results: dict[str, deque[str]] = defaultdict(deque)
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
    played = _Played(model.synthesis_after, model.synthesis_key)
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
        results: dict[str, deque[str]],
    ) -> None:
        self.recording = recording
        self.tools = tools
        self.effects = effects
        self.results = results
        self.served = 0
        """Recorded turns handed to the loop so far."""
        self.synthesis_after: int | None = None
        self.synthesis_key: str | None = None
        self.view: Any = None
        """The run's read-only view (`RunLoop.view`): which key brought a synthesis turn."""

    async def request(self, request: ModelRequest) -> ModelResponse:
        if request.tool_choice == "none":  # the loop asks for a synthesis-only turn
            if self.synthesis_after is None:
                self.synthesis_after = self.served - 1
                self.synthesis_key = self.view.repeating_key() if self.view else None
            return ModelResponse("(replay) the synthesis-only turn would come here.")
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
            self.results[call.key].append(_result_text(recorded))
            calls.append(call)
        await asyncio.sleep(0)
        return ModelResponse(None, tuple(calls))


class _AnyArguments(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="allow")


def _tools(
    recording: Recording, effects: EffectChoice, results: dict[str, deque[str]]
) -> dict[tuple[str, Effect], Tool]:
    """One tool per recorded tool name and effect; a tool seen with two effects (an editor
    that views and writes) becomes two tools, `NAME` and `NAME~EFFECT`."""
    pairs = {
        (call.tool, effect_of(call, effects)) for turn in recording.turns for call in turn
    }
    by_name: dict[str, set[Effect]] = defaultdict(set)
    for name, effect in pairs:
        by_name[name].add(effect)
    tools = {}
    for name, effect in sorted(pairs, key=lambda p: (p[0], p[1].value)):
        keel_name = name if len(by_name[name]) == 1 else f"{name}~{effect.value}"
        tools[(name, effect)] = _recorded_tool(keel_name, effect, results)
    return tools


def _recorded_tool(name: str, effect: Effect, results: dict[str, deque[str]]) -> Tool:
    async def answer(arguments: _AnyArguments) -> str:
        key = ToolCall.from_arguments("", name, arguments.model_dump()).key
        queue = results.get(key)
        return queue.popleft() if queue else "(replay) no recorded result"

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
    return f"(replay) result {call.result}" if call.result else "(replay) no result recorded"


def _frozen(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    return value
