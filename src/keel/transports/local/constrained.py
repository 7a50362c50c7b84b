"""Grammar-constrained sampling on llama.cpp, at the cost of a few candidates per token.

llama-cpp-python can put a grammar in its sampler chain, but there the grammar is tried against
every token of the vocabulary (152,000 for Qwen) at every step: measured here, that halves the
speed of a plain answer and makes the first token of a call take seconds. llama.cpp's own tools
avoid this by trying the grammar on the likely tokens first, and `GrammarMask` does the same as
a logits processor, ahead of the sampler chain:

1. the token sampled at the previous step (the last of ``input_ids``) is accepted into the
   grammar's state;
2. the grammar is applied to the `TOP` tokens with the highest logits only; every other token
   is set to ``-inf``;
3. when none of those is allowed (rare: the model wants something the grammar forbids), the
   grammar is applied to the whole vocabulary instead.

Either way only tokens the grammar allows keep a finite logit, so whatever the sampler picks
(greedy or seeded) is allowed: the output always belongs to the grammar's language, and an
end-of-turn token is only allowed once the grammar is complete. The repeat penalty, top-k/top-p
and temperature then choose among the allowed tokens. A grammar that llama.cpp cannot parse is a
ConfigError at construction (llama.cpp returns no sampler).

Not thread-safe: one mask serves one generation, in the thread that runs it.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from keel.errors import ConfigError

__all__ = ["TOP", "GrammarMask"]

TOP = 64
"""Candidates tried against the grammar first; the sampler's own top-k (20 by default) picks
among the allowed ones, so this is wide enough not to change what it would choose."""

_TOKEN_DATA = np.dtype([("id", np.intc), ("logit", np.single), ("p", np.single)], align=True)


class GrammarMask:
    """A logits processor (``(input_ids, scores) -> scores``) for one generation."""

    def __init__(self, llama_cpp: Any, model: Any, grammar: str, prompt_tokens: int) -> None:
        """`llama_cpp` is the imported module, `model` a loaded ``llama_cpp.Llama``, `grammar`
        GBNF text with a ``root`` rule, `prompt_tokens` the prompt's length (the first call sees
        no sampled token yet)."""
        self._lib = llama_cpp
        vocab = llama_cpp.llama_model_get_vocab(model.model)
        self._sampler = llama_cpp.llama_sampler_init_grammar(
            vocab, grammar.encode("utf-8"), b"root"
        )
        if not self._sampler:
            raise ConfigError("llama.cpp could not parse the turn's grammar")
        self._seen = prompt_tokens
        self.full_scans = 0
        """Steps where no likely token was allowed and the whole vocabulary was tried."""

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        if len(input_ids) > self._seen:  # the token sampled at the previous step
            self._lib.llama_sampler_accept(self._sampler, int(input_ids[-1]))
        self._seen = len(input_ids)
        top = np.argpartition(scores, -TOP)[-TOP:]
        allowed_ids, allowed_logits = self._allowed(top, scores[top])
        if not len(allowed_ids):
            self.full_scans += 1
            allowed_ids, allowed_logits = self._allowed(np.arange(len(scores)), scores)
        masked = np.full_like(scores, -np.inf)
        masked[allowed_ids] = allowed_logits
        return masked

    def _allowed(self, ids: Any, logits: Any) -> tuple[Any, Any]:
        data = np.empty(len(ids), dtype=_TOKEN_DATA)
        data["id"], data["logit"], data["p"] = ids, logits, 0.0
        array = self._lib.llama_token_data_array(
            data=data.ctypes.data_as(ctypes.POINTER(self._lib.llama_token_data)),
            size=len(ids),
            selected=-1,
            sorted=False,
        )
        self._lib.llama_sampler_apply(self._sampler, ctypes.byref(array))
        keep = np.isfinite(data["logit"])
        return data["id"][keep], data["logit"][keep]

    def close(self) -> None:
        if self._sampler:
            self._lib.llama_sampler_free(self._sampler)
            self._sampler = None

    def __del__(self) -> None:
        self.close()
