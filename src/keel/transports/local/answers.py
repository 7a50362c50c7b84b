"""Short answers that do not repeat themselves, for the small local model (issue 25).

The 0.5B model's synthesized answers ran on until the output limit cut them: "1. The `run_loop`
class ... is missing the `run` method ... 2. The `run` method ... is missing the `run` method"
for 512 tokens. Two things keep its answer small, both in the sampler, where they hold:

- `NoRepeats`, a logits processor behind the grammar mask: once the answer has written a run of
  `NGRAM` tokens, the token that would write the same run again is not allowed (unless it is
  the only one the grammar allows). A legitimate list repeats shorter runs ("from keel._run."
  is six tokens), never ten in a row; a loop repeats whole sentences. Calls are not touched:
  the processor stands aside from the first token when the output starts a call.
- `SHORT_ANSWER_RULE`, the answer branch of a synthesis turn's grammar: at most `MAX_LINES`
  lines. A synthesis turn is the model's last word; a list of two dozen modules fits, an
  endless one does not.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["MAX_LINES", "NGRAM", "SHORT_ANSWER_RULE", "NoRepeats"]

NGRAM = 10
MAX_LINES = 30
SHORT_ANSWER_RULE = (
    r'[^<{`\x00\n] [^\x00\n]* ( "\n" [^\x00\n]* )' + f"{{0,{MAX_LINES - 1}}}"
)
"""An answer as `keel.transports.local.grammar.ANSWER_RULE` has it (prose first), in at most
`MAX_LINES` lines."""


class NoRepeats:
    """A logits processor (``(input_ids, scores) -> scores``) for one generation: no run of
    `NGRAM` output tokens is written twice. `starts_a_call(token)` tells a call's first token,
    after which it does nothing."""

    def __init__(
        self, prompt_tokens: int, starts_a_call: Callable[[int], bool], n: int = NGRAM
    ) -> None:
        self._start, self._n = prompt_tokens, n
        self._starts_a_call = starts_a_call
        self._followers: dict[tuple[int, ...], set[int]] = {}
        self._recorded = 0
        self._off: bool | None = None
        self.banned = 0
        """Tokens it did not allow, over the generation (for measurements)."""

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        out = [int(t) for t in input_ids[self._start :]]
        if out and self._off is None:
            self._off = self._starts_a_call(out[0])
        if self._off or len(out) < self._n - 1:
            return scores
        while self._recorded + self._n <= len(out):  # every run written so far, once
            run = out[self._recorded : self._recorded + self._n]
            self._followers.setdefault(tuple(run[:-1]), set()).add(run[-1])
            self._recorded += 1
        repeats = self._followers.get(tuple(out[len(out) - self._n + 1 :]))
        if not repeats:
            return scores
        banned = [t for t in repeats if scores[t] != float("-inf")]
        finite = int((scores != float("-inf")).sum())
        if banned and finite > len(banned):  # never leave the grammar nothing to allow
            scores[banned] = float("-inf")
            self.banned += len(banned)
        return scores
