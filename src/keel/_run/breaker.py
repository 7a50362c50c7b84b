"""The identical-call breaker: run-wide counters per call key, and what restarts them.

The counter of a key counts answered calls with that key in the run (executed, failed,
invalid, unknown, denied again): not per turn and not "consecutive". A batch is checked whole
before anything in it runs, so a loop fails before it costs another dispatch. Two policies
decide what restarts a counter (docs/adr/0029, measured with `keel replay`):

    adr        as the commissioning ADR states it: every identical call counts; only an
               observation whose content changed restarts its counter (the page progressed),
               at most `reset_cap` times per key
    progress   an identical call counts as a repeat only if nothing changed since its last
               occurrence. Two things count as change: the world moved (a side-effecting call
               produced a result the run had not seen from it before), at most
               WORLD_RESET_CAP times per key; or the call's own result differs from its last
               one, at most `reset_cap` times per key. An identical call whose result the
               model already has, with nothing changed in between, still counts.

Whatever the policy: synthesis at T-1, refusal of tools in the synthesis turn and the hard
limit at T are the same; the counters, the resets used and the world version are checkpointed.

Repeat tiers (docs/adr/0050) are further rules of the same policy: other ways for calls to
count as one repeat, each a counter in the same run-wide, checkpointed table under a key of its
own (`~TIER TOOL` or `~alternation TOOLS DIGEST`, which no call key can be: one per tool,
not per result), counted when a result is in:

    same_result   calls of one tool whose results are identical and say something (not empty,
                  not an exit status or a fixed success line alone: `keel.informative`,
                  ADR 0064) count together, whatever their arguments; any other
                  side-effecting call answered in between, or a call whose result differs
                  from its key's last one (the world changed),
                  restarts the count (a side effect of the chain's own tool that got the
                  chain's result again is one more of the chain: it changed nothing it shows)
    alternation   two or three distinct calls taking turns, each with the result it had one
                  cycle before: every call that repeats the call one cycle back counts one
                  (A B A B A B: 4, the synthesis turn at T = 5, one call before the identical
                  counter's); anything else ends the alternation and its count
    same_error    a tool failing with the same error counts, whatever its arguments; what
                  restarts a same_result count restarts it too

A tier's counter at T-1 brings the synthesis turn as an identical call's does. Its hard limit
refuses, before it runs, a call that would continue a tier count standing at T-1 (the next
call of that tool; the call that continues the alternation): a synthesis turn comes first, so
only a run without one (`keel replay`'s second pass) reaches it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, replace

from keel.informative import NOTHING_DIGESTS
from keel.limits import REPEAT_TIERS, LoopPolicy, RepeatTier
from keel.records import KeyCounter, RepeatState

__all__ = [
    "TIER_PREFIX",
    "WORLD_RESET_CAP",
    "IdenticalCallBreaker",
    "Restart",
    "repeated_tools",
    "tier_of",
]

TIER_PREFIX = "~"
"""A tier's counter key starts with this and a space follows the tier's name: a call key is a
tool's name followed by a space, and no tool is named `~same_result`."""

_PERIODS = (2, 3)


def tier_of(key: str) -> RepeatTier | None:
    """The tier a counter key belongs to; None for an identical-call key."""
    if not key.startswith(TIER_PREFIX):
        return None
    name = key[len(TIER_PREFIX) :].split(" ", 1)[0]
    for tier in REPEAT_TIERS:
        if name == tier:
            return tier
    return None


WORLD_RESET_CAP = 20
"""Restarts per key because a side effect changed the world (policy `progress`). High enough
for the longest edit-and-rerun sequence of a resolved run in the replayed corpora, low enough
that two side effects whose results tick like a clock cannot keep a loop alive forever."""


@dataclass(frozen=True, slots=True)
class Restart:
    """A counter that restarted at 1, and why: its result changed, or the world did."""

    key: str
    reason: str
    """"result_changed" or "world_changed"."""
    resets: int
    """Restarts of this kind the key has used."""


class IdenticalCallBreaker:
    def __init__(
        self,
        threshold: int,
        reset_cap: int,
        counters: dict[str, KeyCounter] | None = None,
        *,
        policy: LoopPolicy = "adr",
        world: int = 0,
        tiers: Sequence[RepeatTier] = (),
        repeats: RepeatState | None = None,
    ) -> None:
        self.threshold = threshold
        self.reset_cap = reset_cap
        self.policy: LoopPolicy = policy
        self.world = world
        """The run's world version: side-effecting calls that produced an unseen result."""
        self.counters: dict[str, KeyCounter] = counters or {}
        self.tiers = frozenset(tiers)
        self.repeats = repeats or RepeatState()
        """The tiers' state besides their counters, saved with the run's state."""
        self._near = {k for k, c in self.counters.items() if c.count >= threshold - 1}
        self._dirty: set[str] = set()
        self._changed = False
        """The last `settle`d call's result differed from its key's last one."""
        self._nudge: set[str] = set()
        """Keys that reached T-2 in the last batch (the nudge): never checkpointed."""

    def first_tripping_key(
        self, keys: Sequence[str], names: Sequence[str] = ()
    ) -> tuple[str, int] | None:
        """The key (and its would-be count) that this batch would bring to the threshold;
        `names` (the calls' tool names) lets a tier standing at T-1 refuse its next call."""
        tripped = self._tier_tripping(keys, names)
        if tripped is not None:
            return tripped
        pending: dict[str, int] = {}
        for key in keys:
            current = pending.get(key)
            if current is None:
                counter = self.counters.get(key)
                current = 0 if counter is None or self._world_moved(counter) else counter.count
            pending[key] = current + 1
            if pending[key] >= self.threshold:
                return key, pending[key]
        return None

    def record(self, keys: Sequence[str]) -> list[Restart]:
        """Count a batch's calls (before they run); under `progress`, a key whose world moved
        since its last call restarts at 1 instead."""
        self._nudge = set()  # a batch's repeats nudge the turn after it, and only that one
        restarts = []
        for key in keys:
            counter = self.counters.get(key)
            if counter is None:
                counter = self.counters[key] = KeyCounter()
            if counter.count and self._world_moved(counter):
                counter.change_resets += 1
                counter.count = 1
                restarts.append(Restart(key, "world_changed", counter.change_resets))
            else:
                counter.count += 1
            counter.world = self.world
            self._touch(key, counter)
        return restarts

    def uncount(self, key: str) -> None:
        """Take back one counted call of `key`: it ran as another call (its arguments were
        edited by a person or a hook), whose key is counted instead (ADR 0052)."""
        counter = self.counters.get(key)
        if counter is not None and counter.count > 0:
            counter.count -= 1
            self._touch(key, counter)

    def settle(
        self, key: str, digest: str, *, observation: bool, side_effect: bool
    ) -> Restart | None:
        """A call's result is in (it ran and did not fail): restart its counter if the result
        progressed, and move the world if a side effect produced something new. Called in
        request order, so a later side effect of the batch counts as after this call."""
        counter = self.counters.get(key)
        if counter is None:
            counter = self.counters[key] = KeyCounter()
        previous, counter.last_digest = counter.last_digest, digest
        self._changed = previous is not None and previous != digest  # for `answered`
        self._dirty.add(key)
        restart = None
        if self.policy == "adr" and not observation:
            return None
        changed = previous is not None and previous != digest
        if changed and counter.count > 1 and counter.resets < self.reset_cap:  # 1: restarted
            counter.resets += 1
            counter.count = 1
            self._touch(key, counter)
            restart = Restart(key, "result_changed", counter.resets)
        if self.policy == "progress" and side_effect and previous != digest:
            self.world += 1
        counter.world = self.world
        return restart

    def answered(
        self, key: str, tool: str, digest: str, *, error: bool, empty: bool, side_effect: bool
    ) -> None:
        """A call's result is in, error or not (in request order, after `settle`): count it
        in the tiers in force. `empty` (or a digest of a bare acknowledgement): the result
        says nothing (`keel.informative`), so it makes no chain, and a side effect that
        got it took: progress. A side effect answered without error, or any call whose result
        differs from its key's last one, moves `repeats.writes`: what happened since may have
        changed what a chain's calls would see."""
        changed, self._changed = self._changed and not error, False
        chained = None
        empty = empty or digest in NOTHING_DIGESTS  # says nothing: never a chain (ADR 0064)
        if changed:  # evidence that something changed: every chain restarts
            self.repeats = replace(self.repeats, writes=self.repeats.writes + 1)
        if "same_result" in self.tiers and not error and not empty:
            chained = self._chain(f"{TIER_PREFIX}same_result {tool}", digest)
        if "same_error" in self.tiers and error:
            self._chain(f"{TIER_PREFIX}same_error {tool}", digest)
        if "alternation" in self.tiers:
            self._alternate(key, digest)
        if side_effect and not error:
            self.repeats = replace(self.repeats, writes=self.repeats.writes + 1)
            if chained is not None:  # its own side effect is in the chain, not between
                chained.world = self.repeats.writes

    def observe(self, key: str, digest: str) -> bool:
        """An observation's result (the ADR's evidence reset): True when it restarted."""
        return self.settle(key, digest, observation=True, side_effect=False) is not None

    def synthesis_key(self) -> str | None:
        """A key standing at threshold-1 or above: the next turn must be synthesis-only. The
        same under every policy: a world that moved restarts a key only when it is called
        again (`record`), so a counter that stands at T-1 after a batch still brings the
        synthesis turn."""
        return min(self._near) if self._near else None

    def nudge_key(self) -> str | None:
        """A key (a call's or a tier's) that the last batch brought to T-2, the first repeat
        it sees: the next turn may carry the nudge. None when one already stands at T-1."""
        if self._near or self.threshold < 4:  # at T = 3, T-2 is every first call
            return None
        found = [k for k in self._nudge if self.count(k) == self.threshold - 2]
        return min(found) if found else None

    def count(self, key: str) -> int:
        counter = self.counters.get(key)
        return counter.count if counter else 0

    def take_dirty(self) -> dict[str, KeyCounter]:
        """Counters changed since the last checkpoint: a step writes only these."""
        dirty = {key: self.counters[key] for key in self._dirty}
        self._dirty = set()
        return dirty

    def _chain(self, key: str, digest: str) -> KeyCounter:
        """One more call in a tool's same_result/same_error chain: the chain restarts at 1
        with another result, or when something changed since its last call."""
        counter = self.counters.get(key)
        if counter is None:
            counter = self.counters[key] = KeyCounter()
        writes = self.repeats.writes
        same = counter.last_digest == digest and counter.world == writes
        counter.count = counter.count + 1 if same else 1
        counter.last_digest = digest
        counter.world = writes
        self._touch(key, counter)
        return counter

    def _alternate(self, key: str, digest: str) -> None:
        """Continue or end the alternations of period 2 and 3 with this answered call."""
        state = self.repeats
        recent = list(zip(state.recent_keys, state.recent_digests, strict=True))
        running = list(state.alternating)
        for i, period in enumerate(_PERIODS):
            current = running[i]
            continues = (
                len(recent) >= period
                and recent[-period] == (key, digest)
                and len({k for k, _ in recent[1 - period :]} | {key}) == period
            )
            if continues:
                if not current:
                    cycle = sorted({k for k, _ in recent[1 - period :]} | {key})
                    current = _alternation_key(cycle)
                counter = self.counters.get(current)
                if counter is None:
                    counter = self.counters[current] = KeyCounter()
                counter.count += 1
                self._touch(current, counter)
            elif current:
                ended = self.counters.get(current)
                if ended is not None and ended.count:
                    ended.count = 0
                    self._touch(current, ended)
                current = ""
            running[i] = current
        recent = [*recent, (key, digest)][-3:]
        self.repeats = replace(
            state,
            recent_keys=tuple(k for k, _ in recent),
            recent_digests=tuple(d for _, d in recent),
            alternating=tuple(running),
        )

    def _tier_tripping(self, keys: Sequence[str], names: Sequence[str]) -> tuple[str, int] | None:
        """A tier counter standing at T-1 that a call of this batch would continue."""
        if not self.tiers:
            return None
        near = sorted(k for k in self._near if k.startswith(TIER_PREFIX))
        if not near:
            return None
        writes = self.repeats.writes
        for n, key in enumerate(keys):
            tool = names[n] if n < len(names) else None
            for tier_key in near:
                counter = self.counters[tier_key]
                tier = tier_of(tier_key)
                if tier == "alternation":
                    period = 2 if self.repeats.alternating[0] == tier_key else 3
                    recent = self.repeats.recent_keys
                    continues = (
                        tier_key in self.repeats.alternating
                        and len(recent) >= period
                        and recent[-period] == key
                    )
                else:
                    continues = (
                        tool is not None
                        and counter.world == writes
                        and tier_key == f"{TIER_PREFIX}{tier} {tool}"
                    )
                if continues:
                    return tier_key, counter.count + 1
        return None

    def _world_moved(self, counter: KeyCounter) -> bool:
        return (
            self.policy == "progress"
            and counter.world != self.world
            and counter.change_resets < WORLD_RESET_CAP
        )

    def _touch(self, key: str, counter: KeyCounter) -> None:
        self._dirty.add(key)
        if counter.count == self.threshold - 2:
            self._nudge.add(key)
        if counter.count >= self.threshold - 1:
            self._near.add(key)
        else:
            self._near.discard(key)


def _alternation_key(cycle: list[str]) -> str:
    """The counter key of an alternation: its calls' tools, then a digest of their keys."""
    tools = sorted({k.split(" ", 1)[0] for k in cycle})
    digest = hashlib.sha256("\n".join(cycle).encode("utf-8", "replace")).hexdigest()[:16]
    return f"{TIER_PREFIX}alternation {'|'.join(tools)} {digest}"


def repeated_tools(key: str) -> str:
    """The tool (or tools) a counter key is about, named without arguments: what a nudge may
    say of the repeat."""
    if key.startswith(TIER_PREFIX):
        parts = key.split(" ")
        return " and ".join(parts[1].split("|")) if len(parts) > 1 else key
    return key.split(" ", 1)[0]
