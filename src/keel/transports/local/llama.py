"""llama.cpp's side of the local transport: what a generation produced, its errors as Keel's,
and the hooks that let a generation be cancelled (split from
`keel.transports.local.transport`, which keeps the request and sampling loop).

- `Generation`: the counts and timings of one generation, before it is read as text or calls;
- `map_error`: an exception from llama.cpp as a ProviderError (a prompt over the window says
  both numbers);
- `LlamaTokenCounter`: the model's own tokenizer, for the run's context budget;
- cancellation: `abort_when` installs llama.cpp's abort callback, which stops a prompt's
  evaluation between two graph nodes, and `stop_when` leaves only the end-of-turn token once
  the run is cancelled;
- `common_prefix`: how many prompt tokens the KV cache already holds.
"""

from __future__ import annotations

import importlib
import threading
from dataclasses import dataclass
from typing import Any

from keel.errors import ConfigError, ContextOverflow, ProviderError
from keel.transports.local.weights import INSTALL_HINT
from keel.transports.overflow import find_overflow

__all__ = [
    "Generation",
    "LlamaTokenCounter",
    "abort_when",
    "common_prefix",
    "import_llama_cpp",
    "map_error",
    "starts_a_call",
    "stop_when",
]


@dataclass(frozen=True, slots=True)
class Generation:
    """What one generation produced and cost, before it is read as text or calls."""

    text: str
    output_tokens: int
    prompt_tokens: int
    cached_tokens: int
    """Prompt tokens llama.cpp kept from the previous generation instead of evaluating them."""
    stop_reason: str
    """"stop" (end of turn) or "length" (the output limit)."""
    prompt_seconds: float
    """Evaluating the prompt (what was not cached) and sampling the first token."""
    generate_seconds: float
    """Every token after the first."""

    @property
    def prompt_tokens_per_second(self) -> float:
        evaluated = self.prompt_tokens - self.cached_tokens
        return evaluated / self.prompt_seconds if self.prompt_seconds > 0 else 0.0

    @property
    def tokens_per_second(self) -> float:
        later = self.output_tokens - 1
        return later / self.generate_seconds if later > 0 and self.generate_seconds > 0 else 0.0


def map_error(exc: Exception, *, n_ctx: int) -> ProviderError:
    """An exception from llama.cpp as a ProviderError; nothing here is retryable. A prompt over
    the window ("Requested tokens (N) exceed context window of M", recognised with every other
    wire's wordings in `keel.transports.overflow`) is a `ContextOverflow` with both numbers."""
    overflow = find_overflow(None, str(exc))
    if overflow is not None:
        prompt, window = overflow.requested, overflow.limit or n_ctx
        size = f"{prompt} tokens, more" if prompt is not None else "longer"
        return ContextOverflow(
            f"local model: the prompt is {size} than its context window of {window} "
            f"(n_ctx={n_ctx}); lower the run's context budget (--context-tokens) below the "
            "window minus the output limit, or load the model with a larger n_ctx",
            requested=prompt,
            limit=window,
        )
    if isinstance(exc, ConfigError):
        return ProviderError(f"local model unavailable: {exc}")
    return ProviderError(f"local model failed: {type(exc).__name__}: {exc}")


class LlamaTokenCounter:
    """Counts with the model's own tokenizer, so the context budget matches the real prompt."""

    def __init__(self, llama: Any) -> None:
        """`llama` is a loaded ``llama_cpp.Llama``; `LocalTransport.token_counter()` makes one."""
        self._llama = llama

    def count(self, text: str) -> int:
        if not text:
            return 0
        data = text.encode("utf-8", "surrogatepass")
        return len(self._llama.tokenize(data, add_bos=False, special=False))



def import_llama_cpp() -> Any:
    try:
        return importlib.import_module("llama_cpp")
    except ImportError as exc:
        raise ConfigError(
            f"the local model needs llama-cpp-python, which is not installed: {INSTALL_HINT}"
        ) from exc


def starts_a_call(llama: Any, token: int) -> bool:
    return llama.detokenize([token], special=True).lstrip()[:1] in (b"<", b"{")


class _Abort:
    """llama.cpp's abort callback on one context for one generation: `llama_decode` (the
    prompt's evaluation above all) returns early once `cancel` is set. The ctypes callback is
    kept alive here while it is installed, and removed by `close`."""

    def __init__(self, llama_cpp: Any, llama: Any, cancel: threading.Event) -> None:
        self._llama_cpp, self._ctx = llama_cpp, llama.ctx
        self._callback = llama_cpp.ggml_abort_callback(lambda _data: cancel.is_set())
        llama_cpp.llama_set_abort_callback(self._ctx, self._callback, None)

    def close(self) -> None:
        none = self._llama_cpp.ggml_abort_callback()  # a NULL function pointer
        self._llama_cpp.llama_set_abort_callback(self._ctx, none, None)


class _NoAbort:
    def close(self) -> None:
        pass


def abort_when(llama_cpp: Any, llama: Any, cancel: threading.Event | None) -> _Abort | _NoAbort:
    if cancel is None or not hasattr(llama_cpp, "llama_set_abort_callback"):
        return _NoAbort()
    return _Abort(llama_cpp, llama, cancel)


def stop_when(cancel: threading.Event | None, eos: int) -> Any:
    """A logits processor that leaves only the end-of-turn token once `cancel` is set."""
    if cancel is None:
        return None

    def process(input_ids: Any, scores: Any) -> Any:
        if cancel.is_set():
            scores[:] = float("-inf")
            scores[eos] = 0.0
        return scores

    return process


def common_prefix(before: Any, after: list[int]) -> int:
    """Leading tokens the cached tokens and the new prompt share."""
    n = min(len(before), len(after))
    if n == 0:
        return 0
    import numpy as np

    differ = (np.asarray(before[:n]) != np.asarray(after[:n])).nonzero()[0]
    return int(differ[0]) if len(differ) else n
