"""The identical-call breaker: run-wide counters per call key, and evidence resets.

The counter of a key counts every answered call with that key in the run (executed, failed,
invalid, unknown, denied again): not per turn and not "consecutive". A batch is checked whole
before anything in it runs, so a loop fails before it costs another dispatch. Observations whose
content changed restart their counter (the page progressed), at most `reset_cap` times per key.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from keel.records import KeyCounter

__all__ = ["IdenticalCallBreaker"]


class IdenticalCallBreaker:
    def __init__(
        self, threshold: int, reset_cap: int, counters: dict[str, KeyCounter] | None = None
    ) -> None:
        self.threshold = threshold
        self.reset_cap = reset_cap
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
                current = counter.count if counter else 0
            pending[key] = current + 1
            if pending[key] >= self.threshold:
                return key, pending[key]
        return None

    def record(self, keys: Iterable[str]) -> None:
        for key in keys:
            counter = self.counters.setdefault(key, KeyCounter())
            counter.count += 1
            self._touch(key, counter)

    def observe(self, key: str, digest: str) -> bool:
        """Note an observation's result; reset the counter if the content progressed.

        Returns True when a reset was applied.
        """
        counter = self.counters.setdefault(key, KeyCounter())
        previous, counter.last_digest = counter.last_digest, digest
        self._dirty.add(key)
        if previous is None or previous == digest or counter.resets >= self.reset_cap:
            return False
        counter.resets += 1
        counter.count = 1
        self._touch(key, counter)
        return True

    def synthesis_key(self) -> str | None:
        """A key standing at threshold-1 or above: the next turn must be synthesis-only."""
        return min(self._near) if self._near else None

    def count(self, key: str) -> int:
        counter = self.counters.get(key)
        return counter.count if counter else 0

    def take_dirty(self) -> dict[str, KeyCounter]:
        """Counters changed since the last checkpoint: a step writes only these."""
        dirty = {key: self.counters[key] for key in self._dirty}
        self._dirty = set()
        return dirty

    def _touch(self, key: str, counter: KeyCounter) -> None:
        self._dirty.add(key)
        if counter.count >= self.threshold - 1:
            self._near.add(key)
        else:
            self._near.discard(key)
