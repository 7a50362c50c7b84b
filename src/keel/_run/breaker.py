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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from keel.limits import LoopPolicy
from keel.records import KeyCounter

__all__ = ["WORLD_RESET_CAP", "IdenticalCallBreaker", "Restart"]

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
    ) -> None:
        self.threshold = threshold
        self.reset_cap = reset_cap
        self.policy: LoopPolicy = policy
        self.world = world
        """The run's world version: side-effecting calls that produced an unseen result."""
        self.counters: dict[str, KeyCounter] = counters or {}
        self._near = {k for k, c in self.counters.items() if c.count >= threshold - 1}
        self._dirty: set[str] = set()

    def first_tripping_key(self, keys: Sequence[str]) -> tuple[str, int] | None:
        """The key (and its would-be count) that this batch would bring to the threshold."""
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

    def observe(self, key: str, digest: str) -> bool:
        """An observation's result (the ADR's evidence reset): True when it restarted."""
        return self.settle(key, digest, observation=True, side_effect=False) is not None

    def synthesis_key(self) -> str | None:
        """A key standing at threshold-1 or above: the next turn must be synthesis-only. The
        same under every policy: a world that moved restarts a key only when it is called
        again (`record`), so a counter that stands at T-1 after a batch still brings the
        synthesis turn."""
        return min(self._near) if self._near else None

    def count(self, key: str) -> int:
        counter = self.counters.get(key)
        return counter.count if counter else 0

    def take_dirty(self) -> dict[str, KeyCounter]:
        """Counters changed since the last checkpoint: a step writes only these."""
        dirty = {key: self.counters[key] for key in self._dirty}
        self._dirty = set()
        return dirty

    def _world_moved(self, counter: KeyCounter) -> bool:
        return (
            self.policy == "progress"
            and counter.world != self.world
            and counter.change_resets < WORLD_RESET_CAP
        )

    def _touch(self, key: str, counter: KeyCounter) -> None:
        self._dirty.add(key)
        if counter.count >= self.threshold - 1:
            self._near.add(key)
        else:
            self._near.discard(key)
