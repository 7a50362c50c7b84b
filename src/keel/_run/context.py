"""The context builder: stored items in, a ModelRequest out. Pure: no I/O, no printing.

Three properties make it cheap and cache-friendly:
- the frozen prefix (system text and tool definitions) is fixed when the run starts;
- every item is counted once when it is appended, and a running total is kept, so a turn costs
  time in the new items only;
- over the budget, the oldest large tool results are replaced by short pointers, oldest first,
  in one batch down to a low-water mark (`elide_to` of the budget), and a result once elided
  stays elided. Everything before the first result elided is left as it was, so the request
  repeats the previous one byte for byte up to there; and eliding in batches leaves the turns
  between two batches free of any change, so each of them repeats the whole previous request.
  (Eliding one result at a time, every turn past the budget would rewrite the history from its
  oldest result on, and a provider's prompt cache would serve only the first few items.)
Call/result pairs are never split: an elided result keeps its call id and becomes a pointer.

Every tool result is shown with its citable id (`[r1] ...`, ADR 0053): the n-th result of the
history, counted as results are appended, so the id follows from what is recorded alone (a
resumed run, or a follow-up rebuilt from the store, numbers its results the same) and an elided
result's pointer keeps it.

Each request says how much of it repeats the previous request (`repeated_prefix_tokens`, an
estimate for `keel show`) and how many of its leading items are settled for the rest of the run
(`settled_items`: up to the last elided result, nothing will change again), where a transport
can ask the provider to cache (ADR 0021).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from keel.messages import (
    AssistantMessage,
    Item,
    ModelRequest,
    ToolChoice,
    ToolDefinition,
    ToolResult,
    UserMessage,
)
from keel.tokens import TokenCounter, item_tokens

__all__ = [
    "ELIDE_TO",
    "ContextBuilder",
    "labelled",
    "pointer_text",
    "result_ref",
]

ELIDE_TO = 0.5
"""Once over the budget, elision brings the context down to this share of it, which leaves room
for several turns before the next batch. Measured over 100 turns of 20 KB results
(`benchmarks/prompt_cache.py`): the share of input tokens that repeat the previous request goes
from 13% (one result at a time) to 65% at a 30,000-token budget, and from 11% to 86% at 100,000;
lower marks gain a few points more but leave the model much less of its budget."""

_KEY_SHOWN = 160
"""Characters of a call key quoted in a pointer: enough to recognise the call."""


def pointer_text(result: ToolResult) -> str:
    key = result.call_key
    if len(key) > _KEY_SHOWN:
        key = key[: _KEY_SHOWN - 1] + "…"
    return (
        f"[elided to save context: the result of {key} ({result.size} characters, "
        f"sha256:{result.digest[:16]}) was shown earlier and removed from this context]"
    )


def result_ref(number: int) -> str:
    """The citable id of a history's `number`-th tool result (from 1): `r1`, `r2`, ..."""
    return f"r{number}"


def labelled(result: ToolResult, ref: str) -> ToolResult:
    """The result as the model is shown it: its id first, then its content (or pointer)."""
    return dataclasses.replace(result, content=f"[{ref}] {result.content}")


@dataclass(slots=True)
class _Entry:
    item: Item
    tokens: int
    shown_tokens: int
    """What the item costs as shown: its pointer's count once elided."""


class ContextBuilder:
    def __init__(
        self,
        system: str,
        tools: Sequence[ToolDefinition],
        counter: TokenCounter,
        *,
        budget: int,
        elide_min_tokens: int = 200,
        elided: Iterable[str] = (),
        elide_to: float = ELIDE_TO,
    ) -> None:
        if not 0 < elide_to <= 1:
            raise ValueError(f"elide_to must be in (0, 1], not {elide_to}")
        self.system = system
        self.tools = tuple(tools)
        self.counter = counter
        self.budget = budget
        self.elide_min_tokens = elide_min_tokens
        self.low_water = int(budget * elide_to)
        """Elision, once started, goes on until the context fits in this many tokens."""
        self.cache_key: str | None = None
        """Stable for the whole run (the run loop sets the run's id): the provider's cache key."""
        self.prefix_tokens = counter.count(system) + sum(
            counter.count(t.name) + counter.count(t.description) + counter.count(str(t.parameters))
            for t in self.tools
        )
        self._entries: list[_Entry] = []
        self._shown: list[Item] = []
        self._total = self.prefix_tokens
        self._cursor = 0
        """Entries before the cursor are elided or too small to elide: never looked at again."""
        self._before_cursor = 0
        """Tokens of the entries before the cursor, as shown."""
        self._tail_start = 0
        """Results after the last assistant turn: what the model just asked for, never elided."""
        self._settled = 0
        """Entries up to the last elided result: nothing before it changes again."""
        self._sent = -1
        """Items of the last request built (-1: none yet in this process)."""
        self._sent_tokens = 0
        """Their tokens, as shown then."""
        self._kept_tokens: int | None = None
        """Tokens of the items before the first one changed since the last request; None:
        nothing it sent has changed."""
        self.elided: set[str] = set(elided)
        """Call ids whose results are shown as pointers; restored as-is on resume."""
        self.refs: dict[str, str] = {}
        """Each result's citable id (`r1`, ...) by its call id, in the order they came."""
        self._cited: list[tuple[str, ToolResult]] = []

    @property
    def total_tokens(self) -> int:
        return self._total

    def question(self) -> str:
        """The latest question in the history (the run's own); empty when there is none."""
        users = [e.item for e in self._entries if isinstance(e.item, UserMessage)]
        return users[-1].text if users else ""

    def results(self) -> list[tuple[str, ToolResult]]:
        """Every result of the history with its citable id, as recorded (never a pointer):
        what an answer's citations are checked against (keel/evidence.py)."""
        return list(self._cited)

    def append(self, item: Item) -> None:
        shown: Item = item
        if isinstance(item, ToolResult):
            ref = self.refs.setdefault(item.call_id, result_ref(len(self._cited) + 1))
            self._cited.append((ref, item))
            shown = labelled(item, ref)
        tokens = shown_tokens = item_tokens(self.counter, shown)
        if isinstance(item, AssistantMessage):
            self._tail_start = len(self._entries) + 1
        if isinstance(item, ToolResult) and item.call_id in self.elided:
            self._settled = len(self._entries) + 1
            shown, shown_tokens = self._pointer(item)
        self._entries.append(_Entry(item, tokens, shown_tokens))
        self._total += shown_tokens
        self._shown.append(shown)

    def extend(self, items: Iterable[Item]) -> None:
        for item in items:
            self.append(item)

    def build(
        self, tool_choice: ToolChoice = None, volatile: Sequence[str] = ()
    ) -> tuple[ModelRequest, list[ToolResult]]:
        """The next request, and the results this build newly elided (to record them)."""
        newly_elided = self._elide_to_budget()
        volatile_tokens = sum(self.counter.count(v) for v in volatile)
        if self._sent < 0:
            repeated = 0
        elif self._kept_tokens is not None:
            repeated = self.prefix_tokens + self._kept_tokens
        else:
            repeated = self.prefix_tokens + self._sent_tokens
        request = ModelRequest(
            system=self.system,
            tools=self.tools,
            items=tuple(self._shown),
            tool_choice=tool_choice,
            volatile=tuple(volatile),
            estimated_input_tokens=self._total + volatile_tokens,
            repeated_prefix_tokens=repeated,
            settled_items=self._settled,
            cache_key=self.cache_key,
        )
        self._sent, self._sent_tokens = len(self._shown), self._total - self.prefix_tokens
        self._kept_tokens = None
        return request, newly_elided

    def _elide_to_budget(self) -> list[ToolResult]:
        """Past the budget, elide oldest first down to the low-water mark, in one batch."""
        newly: list[ToolResult] = []
        if self._total <= self.budget:
            return newly
        while self._total > self.low_water and self._cursor < self._tail_start:
            index = self._cursor
            entry = self._entries[index]
            item = entry.item
            if (
                isinstance(item, ToolResult)
                and item.call_id not in self.elided
                and entry.tokens >= self.elide_min_tokens
            ):
                if self._kept_tokens is None and index < self._sent:
                    self._kept_tokens = self._before_cursor  # the first item changed
                self.elided.add(item.call_id)
                self._shown[index], entry.shown_tokens = self._pointer(item)
                self._total += entry.shown_tokens - entry.tokens
                self._settled = index + 1
                newly.append(item)
            self._before_cursor += entry.shown_tokens
            self._cursor += 1
        return newly

    def _pointer(self, result: ToolResult) -> tuple[ToolResult, int]:
        pointer = dataclasses.replace(result, content=pointer_text(result), elided=True)
        pointer = labelled(pointer, self.refs[result.call_id])
        return pointer, item_tokens(self.counter, pointer)
