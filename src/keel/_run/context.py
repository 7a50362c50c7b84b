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

The model's window is a hard limit (`limit`: the window less the answer's room, issue 44), the
budget a soft one. A request still over the window after the usual elision is fitted, in this
order: every result before the latest batch elided, whatever its size; then the latest batch's
results clamped, largest first, to their head and tail around a pointer; and, for the synthesis
turn that comes when even that does not fit (`squeeze`), the latest batch elided too. Once a run
has elided, truncated or clamped a result it is offered `read_result` (keel/tools/read_back.py),
and every pointer and marker names the exact call that reads the text back.

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
    "Clamp",
    "ContextBuilder",
    "labelled",
    "pointer_text",
    "read_back_call",
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


def pointer_text(result: ToolResult, ref: str | None = None) -> str:
    """What an elided result is shown as; with `ref`, the call that reads it back."""
    key = result.call_key
    if len(key) > _KEY_SHOWN:
        key = key[: _KEY_SHOWN - 1] + "…"
    back = "" if ref is None else f"; read it back with {read_back_call(ref)}"
    return (
        f"[elided to save context: the result of {key} ({result.size} characters, "
        f"sha256:{result.digest[:16]}) was shown earlier and removed from this context{back}]"
    )


def read_back_call(ref: str, offset: int = 0) -> str:
    """The exact call that reads result `ref` back from `offset` (keel/tools/read_back.py)."""
    return f'read_result(id="{ref}"' + (f", offset={offset})" if offset else ")")


_TRUNCATED = "\n[truncated: showing "
"""Where the executor's truncation marker starts (keel/tools/executor.py)."""

SHRINK_TO = 0.75
"""After a refusal as too long, the next request keeps to this share of the refused one (and of
the window the provider named): Keel's count and the provider's differ by up to a fifth."""
MIN_LIMIT = 256
MAPPED_SHARE = 0.9
"""Of the provider's window mapped into Keel's count, the share a request keeps to after a
refusal that said both numbers."""

CLAMP_FLOOR = 48
"""Tokens a clamped result keeps at least: its head, its pointer and its tail."""


@dataclass(frozen=True, slots=True)
class Clamp:
    """A result of the latest batch shown as its head and tail to fit the model's window."""

    result: ToolResult
    shown_chars: int


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
        limit: int | None = None,
        read_back: ToolDefinition | None = None,
        ceiling: int | None = None,
    ) -> None:
        """`limit`: the most tokens a request may have (the model's window less the answer's
        room, less a margin for what the builder does not count), which fitting keeps to;
        `ceiling`: the window less the answer's room, past which a request surely does not
        fit (`fits`); between the two it is sent, and a refusal handled as the provider's;
        None: no window binds. `read_back`: the tool offered once a result is elided,
        truncated or clamped (None: read-back is off, and pointers name no call)."""
        if not 0 < elide_to <= 1:
            raise ValueError(f"elide_to must be in (0, 1], not {elide_to}")
        self.system = system
        self.tools = tuple(tools)
        self.counter = counter
        self.budget = budget
        self.elide_min_tokens = elide_min_tokens
        self.elide_to = elide_to
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
        self._by_ref: dict[str, ToolResult] = {}
        self.limit = limit
        self.ceiling = ceiling
        self.read_back = read_back
        self._truncated = False
        self._prefix_changed = False
        self._read_back_tokens: int | None = None
        self._clamps: dict[str, Clamp] = {}
        self.clamped: set[str] = set()
        """Results clamped to fit the window so far (in this process), by call id."""

    @property
    def total_tokens(self) -> int:
        return self._total

    def question(self) -> str:
        """The latest question in the history (the run's own); empty when there is none."""
        users = [e.item for e in self._entries if isinstance(e.item, UserMessage)]
        return users[-1].text if users else ""

    def results(self) -> list[tuple[str, ToolResult]]:
        """Every result of the history with its citable id, as recorded (never a pointer):
        what an answer's citations are checked against (keel/citations.py)."""
        return list(self._cited)

    def result(self, ref: str) -> ToolResult | None:
        """The result with citable id `ref`, as recorded: what `read_result` reads back."""
        return self._by_ref.get(ref)

    def fits(self, request: ModelRequest) -> bool:
        """Whether `request` fits in the model's window as Keel counts it. Where the frozen
        prefix alone (system text and tool definitions, whose count is Keel's estimate of text
        the transport formats its own way) passes the window, the count is not trusted: the
        request is sent, and a refusal is handled as the provider's (ADR 0060)."""
        if self.limit is None or self.prefix_tokens >= self.limit:
            return True
        return request.estimated_input_tokens <= max(self.limit, self.ceiling or 0)

    def shrink(self, sent: int, window: int | None, requested: int | None = None) -> int:
        """After the provider refused a request of `sent` tokens (as Keel counts them) as too
        long: the most tokens a request may have from here on, which the next build fits to.
        When the provider said both its count of the request and its window, the window is
        mapped into Keel's count (their ratio, with a tenth to spare); else a quarter below
        what was sent. Returns the new limit."""
        target = int(sent * SHRINK_TO)
        if window is not None and requested is not None and requested > window:
            target = int(sent * window / requested * MAPPED_SHARE)
        self.limit = max(MIN_LIMIT, target if self.limit is None else min(self.limit, target))
        self.budget = min(self.budget, self.limit)
        self.low_water = int(self.budget * self.elide_to)
        return self.limit

    def take_clamps(self) -> list[Clamp]:
        """The results clamped since the last call (to record them)."""
        clamps, self._clamps = list(self._clamps.values()), {}
        self.clamped.update(c.result.call_id for c in clamps)
        return clamps

    def append(self, item: Item) -> None:
        shown: Item = item
        if isinstance(item, ToolResult):
            ref = self.refs.setdefault(item.call_id, result_ref(len(self._cited) + 1))
            self._cited.append((ref, item))
            self._by_ref.setdefault(ref, item)
            shown = labelled(item, ref)
            if item.truncated and self.read_back is not None:  # the marker names the call
                self._truncated = True
                cut = item.content.rfind(_TRUNCATED)
                offset = cut if cut >= 0 else len(item.content)
                rest = f"\n[read the rest with {read_back_call(ref, offset)}]"
                shown = dataclasses.replace(shown, content=shown.content + rest)
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
        self, tool_choice: ToolChoice = None, volatile: Sequence[str] = (), *, squeeze: bool = False
    ) -> tuple[ModelRequest, list[ToolResult]]:
        """The next request, and the results this build newly elided (to record them).
        `squeeze`: a synthesis turn from what fits: the latest batch may be elided too."""
        newly_elided = self._elide_to_budget()
        volatile_tokens = sum(self.counter.count(v) for v in volatile)
        if self.limit is not None and self.prefix_tokens < self.limit:  # see `fits`
            # room kept for read_result, which fitting may bring
            room = self.limit - volatile_tokens - self._definition_tokens(self._unoffered())
            if self._total > room:
                newly_elided += self._fit(room, squeeze)
        self._offer_read_back()
        if self._sent < 0 or self._prefix_changed:
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
        self._prefix_changed = False
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
                shown_before = entry.shown_tokens  # less than its count once clamped
                self._shown[index], entry.shown_tokens = self._pointer(item)
                self._total += entry.shown_tokens - shown_before
                self._settled = index + 1
                newly.append(item)
            self._before_cursor += entry.shown_tokens
            self._cursor += 1
        return newly

    def _pointer(self, result: ToolResult, *, compact: bool = False) -> tuple[ToolResult, int]:
        """`compact`: without the call's key and digest, for a synthesis turn that must fit
        (the latest batch, whose calls are just above it)."""
        ref = self.refs[result.call_id]
        text = pointer_text(result, None if self.read_back is None else ref)
        if compact:
            back = "" if self.read_back is None else f": {read_back_call(ref)}"
            text = f"[left out to fit the model's window{back}]"
        pointer = labelled(dataclasses.replace(result, content=text, elided=True), ref)
        return pointer, item_tokens(self.counter, pointer)

    # -- fitting the window (issue 44) ---------------------------------------------------------

    def _fit(self, target: int, squeeze: bool) -> list[ToolResult]:
        """Over the window: elide every result before the latest batch, oldest first, whatever
        its size; then clamp the latest batch's results; with `squeeze`, elide them instead."""
        newly: list[ToolResult] = []
        end = len(self._entries) if squeeze else self._tail_start
        for index in range(end):
            if self._total <= target:
                break
            entry = self._entries[index]
            item = entry.item
            if not isinstance(item, ToolResult):
                continue
            if item.call_id in self.elided:
                if squeeze:  # a synthesis turn that must fit: every pointer compact
                    self._replace(index, *self._pointer(item, compact=True))
                continue
            pointer, tokens = self._pointer(item, compact=squeeze)
            if tokens >= entry.shown_tokens:
                continue  # a result shorter than its pointer stays as it is
            self._replace(index, pointer, tokens)
            self.elided.add(item.call_id)
            newly.append(item)
        if not squeeze:
            self._clamp_latest(target)
        return newly

    def _clamp_latest(self, target: int) -> None:
        """Clamp the latest batch's results, each by its share of what is too much, until the
        request fits or each is down to its head, pointer and tail."""
        for _ in range(3):  # a clamped text's count is estimated first, then checked
            over = self._total - target
            tail = [
                i
                for i in range(self._tail_start, len(self._entries))
                if isinstance(self._entries[i].item, ToolResult)
                and self._entries[i].item.call_id not in self.elided  # type: ignore[union-attr]
            ]
            room = sum(self._entries[i].shown_tokens for i in tail)
            if over <= 0 or room <= CLAMP_FLOOR * len(tail):
                return
            for index in tail:
                entry = self._entries[index]
                share = -(-over * entry.shown_tokens // room)  # rounded up
                keep = max(CLAMP_FLOOR, entry.shown_tokens - share)
                if keep >= entry.shown_tokens:
                    continue
                result = entry.item
                assert isinstance(result, ToolResult)
                clamped = self._clamped(result, keep)
                self._replace(index, clamped, item_tokens(self.counter, clamped))
                self._clamps[result.call_id] = Clamp(result, len(clamped.content))

    def _clamped(self, result: ToolResult, tokens: int) -> ToolResult:
        """`result` shown as its head and tail in about `tokens` tokens, the middle replaced by
        a pointer that names the call reading it back."""
        ref = self.refs[result.call_id]
        text = result.content

        def pointer(head: int, left_out: int) -> str:
            off = "none: read-back is off"
            back = read_back_call(ref, head) if self.read_back is not None else off
            return (
                f"\n[clamped to fit the model's window: {left_out} of {result.size} characters "
                f"left out here; read them with {back}]\n"
            )

        ratio = len(text) / max(1, self.counter.count(text))
        room = tokens - self.counter.count(pointer(len(text), len(text))) - 4
        chars = max(0, int(room * ratio * 0.9))
        head, tail = chars * 2 // 3, chars // 3
        middle = pointer(head, len(text) - head - tail)
        shown = text[:head] + middle + (text[len(text) - tail :] if tail else "")
        return labelled(dataclasses.replace(result, content=shown), ref)

    def _replace(self, index: int, shown: Item, tokens: int) -> None:
        """Show entry `index` as `shown` from now on (a pointer, or a clamped result)."""
        entry = self._entries[index]
        if self._kept_tokens is None and index < self._sent:  # the first item changed
            self._kept_tokens = sum(e.shown_tokens for e in self._entries[:index])
        if index < self._cursor:
            self._before_cursor += tokens - entry.shown_tokens
        self._total += tokens - entry.shown_tokens
        self._shown[index], entry.shown_tokens = shown, tokens
        self._settled = max(self._settled, index + 1)

    def _unoffered(self) -> ToolDefinition | None:
        tool = self.read_back
        return None if tool is None or tool in self.tools else tool

    def _definition_tokens(self, tool: ToolDefinition | None) -> int:
        if tool is None:
            return 0
        if self._read_back_tokens is None:  # counted once: fitting asks every build
            count = self.counter.count
            self._read_back_tokens = (
                count(tool.name) + count(tool.description) + count(str(tool.parameters))
            )
        return self._read_back_tokens

    def _offer_read_back(self) -> None:
        """Add `read_result` to the tools once there is something to read back (a one-time
        change of the frozen prefix)."""
        tool = self._unoffered()
        if tool is None or not (self.elided or self._truncated or self.clamped or self._clamps):
            return
        self.tools = (*self.tools, tool)
        added = self._definition_tokens(tool)
        self.prefix_tokens += added
        self._total += added
        self._prefix_changed = True  # the tools changed: nothing repeats the last request
