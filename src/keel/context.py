"""The context builder: stored items in, a ModelRequest out. Pure: no I/O, no printing.

Three properties make it cheap and cache-friendly:
- the frozen prefix (system text and tool definitions) is fixed when the run starts;
- every item is counted once when it is appended, and a running total is kept, so a turn costs
  time in the new items only;
- over the budget, the oldest large tool results are replaced by short pointers, oldest first,
  and a result once elided stays elided, so what was sent before stays a stable prefix.
Call/result pairs are never split: an elided result keeps its call id and becomes a pointer.
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
)
from keel.tokens import TokenCounter, item_tokens

__all__ = [
    "ContextBuilder",
    "pointer_text",
]

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


@dataclass(slots=True)
class _Entry:
    item: Item
    tokens: int


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
    ) -> None:
        self.system = system
        self.tools = tuple(tools)
        self.counter = counter
        self.budget = budget
        self.elide_min_tokens = elide_min_tokens
        self.prefix_tokens = counter.count(system) + sum(
            counter.count(t.name) + counter.count(t.description) + counter.count(str(t.parameters))
            for t in self.tools
        )
        self._entries: list[_Entry] = []
        self._shown: list[Item] = []
        self._total = self.prefix_tokens
        self._cursor = 0
        """Entries before the cursor are elided or too small to elide: never looked at again."""
        self._tail_start = 0
        """Results after the last assistant turn: what the model just asked for, never elided."""
        self.elided: set[str] = set(elided)
        """Call ids whose results are shown as pointers; restored as-is on resume."""

    @property
    def total_tokens(self) -> int:
        return self._total

    def append(self, item: Item) -> None:
        tokens = item_tokens(self.counter, item)
        if isinstance(item, AssistantMessage):
            self._tail_start = len(self._entries) + 1
        self._entries.append(_Entry(item, tokens))
        if isinstance(item, ToolResult) and item.call_id in self.elided:
            item, tokens = self._pointer(item)
        self._total += tokens
        self._shown.append(item)

    def extend(self, items: Iterable[Item]) -> None:
        for item in items:
            self.append(item)

    def build(
        self, tool_choice: ToolChoice = None, volatile: Sequence[str] = ()
    ) -> tuple[ModelRequest, list[ToolResult]]:
        """The next request, and the results this build newly elided (to record them)."""
        newly_elided = self._elide_to_budget()
        volatile_tokens = sum(self.counter.count(v) for v in volatile)
        request = ModelRequest(
            system=self.system,
            tools=self.tools,
            items=tuple(self._shown),
            tool_choice=tool_choice,
            volatile=tuple(volatile),
            estimated_input_tokens=self._total + volatile_tokens,
        )
        return request, newly_elided

    def _elide_to_budget(self) -> list[ToolResult]:
        newly: list[ToolResult] = []
        while self._total > self.budget and self._cursor < self._tail_start:
            index = self._cursor
            self._cursor += 1
            entry = self._entries[index]
            item = entry.item
            if not isinstance(item, ToolResult) or item.call_id in self.elided:
                continue
            if entry.tokens < self.elide_min_tokens:
                continue
            self.elided.add(item.call_id)
            self._shown[index], pointer_tokens = self._pointer(item)
            self._total += pointer_tokens - entry.tokens
            newly.append(item)
        return newly

    def _pointer(self, result: ToolResult) -> tuple[ToolResult, int]:
        pointer = dataclasses.replace(result, content=pointer_text(result), elided=True)
        return pointer, item_tokens(self.counter, pointer)
