"""Code names in the local model's answers are copied from what the run saw (issue 25).

Asked which modules ``src/keel/_run/loop.py`` imports, the 0.5B model read the file's 25 import
lines and answered with a list of 25 names in backticks: its 21 package imports (one of them
twice), two standard modules, and ```keel.text_listener```, invented from the class
``TextListener``. Prompting does not fix a model this small; its sampler can. `Grounding`, a
logits processor ahead of the grammar mask, holds every code span of an answer (the text between
two backticks) to two rules:

- **copied**: a span is a piece of the run's own text (the question, the tool calls' arguments
  and the tool results), starting and ending at a word boundary there: ```keel._run.batch```
  and ```loop.py``` can be written, ```keel.text_listener``` cannot (once ``keel.`` is
  written, only what follows ``keel.`` somewhere in the results is allowed);
- **listed once**: a list item (a line starting ``-``, ``*`` or ``12.``) cannot open with the
  span an earlier item opened with: the model must go on to a name it has not listed, or end
  the list.

Prose outside backticks is not touched, and neither is a call: the processor stands aside from
the first token when the output starts one. Each token is checked as the text it adds, so a
token holding a backtick (``"`,"``, ``"py`"``) is judged like the characters it writes. Inside a
span only the continuations of the span's occurrences are allowed, found by looking the next
characters up in a table of the vocabulary's texts, so a step costs a few dictionary look-ups,
not a pass over 152,000 tokens. Whatever happens, some token stays allowed: a span at a dead end
(a piece of the corpus that cannot grow into a whole name) closes as it is, and when nothing at
all fits the step is left as it was.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from keel.messages import AssistantMessage, Item, ToolResult, UserMessage

__all__ = ["Grounding", "VocabularyTexts", "corpus_of"]

_WORD = re.compile(r"\w")
_SPAN_START = re.compile(r"(?<!\w)[^\s`]")
"""Where a span may start: not a space or a backtick, and not inside a word."""
_REACH = 32
"""Characters looked up past a span's occurrence: longer tokens are runs of spaces."""
_CLOSERS = ")]}>'\""
"""Besides a word's last character, what a span may end with (``f(x)``, ``"a"``); never a
dot, a comma or a space: ```keel.``` names nothing."""
_NAME = re.compile(r"[\w.]*\w")
_LIST_ITEM = re.compile(r"\s*(?:[-*]|\d+[.)])\s")


@dataclass(frozen=True)
class VocabularyTexts:
    """Each token's text, and the tokens by text: made once per loaded model."""

    texts: Sequence[str]
    by_text: dict[str, list[int]] = field(default_factory=dict)
    with_backtick: list[int] = field(default_factory=list)
    longest: int = 1

    @classmethod
    def of(cls, texts: Sequence[str]) -> VocabularyTexts:
        by_text: dict[str, list[int]] = {}
        for token, text in enumerate(texts):
            if text:
                by_text.setdefault(text, []).append(token)
        return cls(
            texts=texts,
            by_text=by_text,
            with_backtick=[t for t, text in enumerate(texts) if "`" in text],
            longest=max((len(t) for t in texts), default=1),
        )

    @classmethod
    def of_llama(cls, llama: Any) -> VocabularyTexts:
        """The texts of a loaded ``llama_cpp.Llama``'s vocabulary (about a second for Qwen)."""
        texts = [
            llama.detokenize([token], special=False).decode("utf-8", "replace")
            for token in range(llama.n_vocab())
        ]
        return cls.of(texts)


def corpus_of(items: Sequence[Item]) -> str:
    """The text a run's answer may copy its code spans from: what the user said, the calls'
    arguments and the results. Empty when no tool has answered: nothing to hold spans to."""
    if not any(isinstance(item, ToolResult) for item in items):
        return ""
    parts: list[str] = []
    for item in items:
        if isinstance(item, ToolResult):
            parts.append(item.content)
        elif isinstance(item, UserMessage):
            parts.append(item.text)
        elif isinstance(item, AssistantMessage):
            for call in item.tool_calls:
                values = call.arguments if isinstance(call.arguments, dict) else {}
                parts += [str(value) for value in values.values()]
    return "\n".join(parts)


class Grounding:
    """A logits processor (``(input_ids, scores) -> scores``) for one generation; see the
    module docstring. `corpus` is the run's text a span may be copied from; `starts_a_call`
    tells a call's first token."""

    def __init__(
        self,
        corpus: str,
        vocabulary: VocabularyTexts,
        prompt_tokens: int,
        starts_a_call: Callable[[int], bool],
    ) -> None:
        self._corpus = corpus
        self._vocab = vocabulary
        self._start = prompt_tokens
        self._starts_a_call = starts_a_call
        self._off: bool | None = None
        self._text = ""
        self._seen = 0
        self._span_starts: list[int] | None = None
        self._listed: frozenset[str] = frozenset()
        """The spans earlier list items opened with, as of the line `_listed_upto` ends."""
        self._listed_upto = -1
        self._first_of_span: dict[frozenset[str], list[int]] = {}
        self.banned_steps = 0
        """Steps at which it refused a token the model preferred (for measurements)."""

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        out = input_ids[self._start :]
        if len(out) and self._off is None:
            self._off = self._starts_a_call(int(out[0]))
        if self._off or not self._corpus:
            return scores
        for token in out[self._seen :]:
            self._text += self._vocab.texts[int(token)]
        self._seen = len(out)
        self._update_listed()
        best = int(np.argmax(scores))
        span = self._open_span()
        if span is None:  # outside a span only tokens holding a backtick can break a rule
            line = self._text[self._text.rfind("\n") + 1 :]
            refused = [t for t in self._vocab.with_backtick if not self._fits(line, t)]
            masked = scores.copy()
            masked[refused] = -np.inf
        else:
            allowed = self._inside(span)
            masked = np.full_like(scores, -np.inf)
            masked[allowed] = scores[allowed]
        if not np.isfinite(masked).any():
            return scores  # never leave nothing to sample
        if masked[best] == -np.inf:
            self.banned_steps += 1
        return masked

    # -- the state of the answer so far -------------------------------------------------------

    def _open_span(self) -> str | None:
        """The text of the span being written, or None outside one."""
        return _span_of(self._text[self._text.rfind("\n") + 1 :])

    def _update_listed(self) -> None:
        """Read the items of the lines finished since the last step (once per step, not once
        per token tried)."""
        done = self._text.rfind("\n")
        if done == self._listed_upto:
            return
        finished = self._text[self._listed_upto + 1 : done].split("\n")
        firsts = (_first_span_of_item(line) for line in finished)
        self._listed = self._listed | {first for first in firsts if first is not None}
        self._listed_upto = done

    # -- which tokens may come next -----------------------------------------------------------

    def _inside(self, span: str) -> list[int]:
        line = self._text[self._text.rfind("\n") + 1 :]
        opening = line[: len(line) - len(span)]
        listed = self._listed if _first_of_item(opening) else frozenset()
        closing = [t for t in self._vocab.with_backtick if self._fits(line, t)]
        allowed = self._continuations(span, listed) + closing
        if allowed:
            return allowed
        # A dead end (`.` copied from the corpus's last characters, say): the span may end as
        # it is, still a piece of the corpus, though not a whole name.
        return [t for t in self._vocab.with_backtick if self._fits(line, t, relaxed=True)]

    def _continuations(self, span: str, listed: frozenset[str]) -> list[int]:
        """Tokens (without a backtick) that extend `span` to a longer piece of the corpus, but
        not toward a name already `listed`."""
        if not span and listed in self._first_of_span:
            return self._first_of_span[listed]  # the same whenever a span opens
        allowed: set[int] = set()
        reach = min(self._vocab.longest, _REACH)
        for position in self._occurrences(span):
            if listed and _name_at(self._corpus, position, len(span)) in listed:
                continue
            rest = self._corpus[position + len(span) : position + len(span) + reach]
            rest = rest.split("\n", 1)[0].split("`", 1)[0]
            for end in range(1, len(rest) + 1):
                allowed.update(self._vocab.by_text.get(rest[:end], ()))
        found = sorted(allowed)
        if not span:
            self._first_of_span[listed] = found
        return found

    def _fits(self, line: str, token: int, relaxed: bool = False) -> bool:
        """Whether `token`'s text, written after `line`, keeps every span of the line lawful
        (`relaxed`: a span may close wherever it is, as long as it is copied)."""
        text = self._vocab.texts[token]
        span = _span_of(line)
        for char in text:
            if char == "\n":
                if span is not None:
                    return False
                line = ""
                continue
            if char == "`":
                if span is None:
                    if not self._occurrences(""):
                        return False  # nothing in the corpus a span could copy
                    span = ""
                elif not (span if relaxed else self._closes(line, span)):
                    return False
                else:
                    span = None
            elif span is not None:
                if not span and char.isspace():
                    return False
                span += char
                if not self._occurrences(span, first_only=True):
                    return False
            line += char
        return True

    def _closes(self, line: str, span: str) -> bool:
        """A span may end here: it is copied whole, and is not an item listed already."""
        if not span or not (_WORD.match(span[-1]) or span[-1] in _CLOSERS):
            return False
        if not self._whole(span):
            return False
        opening = line[: len(line) - len(span)]
        return not (_first_of_item(opening) and span in self._listed)

    def _whole(self, span: str) -> bool:
        """Some occurrence of `span` ends where a word ends."""
        corpus, n = self._corpus, len(span)
        for position in self._occurrences(span):
            after = corpus[position + n : position + n + 1]
            if not after or not _WORD.match(after) or not _WORD.match(span[-1]):
                return True
        return False

    def _occurrences(self, span: str, first_only: bool = False) -> list[int]:
        """Where `span` occurs in the corpus starting at a word boundary."""
        if not span:
            if self._span_starts is None:
                self._span_starts = [m.start() for m in _SPAN_START.finditer(self._corpus)]
            return self._span_starts
        found, corpus, start = [], self._corpus, 0
        while (position := corpus.find(span, start)) != -1:
            if position == 0 or not _WORD.match(corpus[position - 1]) or not _WORD.match(span[0]):
                found.append(position)
                if first_only:
                    break
            start = position + 1
        return found


def _span_of(line: str) -> str | None:
    return None if line.count("`") % 2 == 0 else line[line.rfind("`") + 1 :]


def _first_of_item(opening: str) -> bool:
    """Whether a span opened after `opening` is the first of a list item's line."""
    return bool(_LIST_ITEM.match(opening)) and opening.count("`") == 1


def _name_at(corpus: str, position: int, written: int) -> str | None:
    """The dotted name that starts at `position`, if the span written so far (`written`
    characters) lies inside it: where this occurrence leads."""
    name = _NAME.match(corpus, position)
    return name.group() if name is not None and name.end() - position >= written else None


def _first_span_of_item(line: str) -> str | None:
    if not _LIST_ITEM.match(line) or line.count("`") < 2:
        return None
    return line.split("`", 2)[1]
