"""The embedded local model, in-process through llama.cpp (``llama-cpp-python``), as a transport.

`LocalTransport` is a **text** transport: it is always used behind
`keel.transports.xml_fallback.XmlFallbackTransport` (the model spec ``local`` means
``xml:`` over it), so the requests it receives carry no tools and no tool-shaped history, and a
request that does is refused as misuse. What it does:

- **Messages.** The system text, then the history (user and assistant turns), then each volatile
  control as a final user message, formatted by llama.cpp's ``chatml`` chat format (Qwen's own
  template). Two repairs on the way: text that spells a control token (``<|im_start|>``,
  ``<|im_end|>``...) gets a zero-width space after its ``<``, because the chat handler tokenises
  the whole prompt with special tokens enabled and a file the agent reads must not be able to
  open a new role; and an empty turn is sent as one space, because chatml would otherwise drop
  its end marker.
- **Stop sequences** (`DEFAULT_STOP`): the chat markers ``<|im_end|>``, ``<|endoftext|>`` and
  ``<|im_start|>``, and ``</call>``. Stopping at the end of the first call block (the stop text
  itself is cut off, and the XML parser accepts a final block without its closing tag) is the
  choice for a 0.5B model: after writing a call, such a model tends to invent the ``<result>``
  it is waiting for and then an answer built on it, which costs seconds per turn on a CPU and
  puts invented evidence in the history. The price is one call per turn, which a model this
  size rarely beats anyway. In a synthesis turn it changes nothing: any call there ends the run.
- **Threads.** Generation is blocking C code: it runs in a worker thread
  (`asyncio.to_thread`) so the event loop stays free, one generation at a time per model (a
  thread lock, valid across event loops). Cancelling the awaiting task (the run's deadline or
  cancellation) sets an event that a per-token logits processor turns into an end-of-turn token
  (about 25 microseconds per token when idle), so the thread, the lock and the process exit are
  not held for the rest of a long generation.
- **Loading** is lazy, on the first request (or `prepare()`), timed in `load_seconds`; without
  a `model_path` the shipped model is joined and verified by `keel.local_model.ensure_model`.
- **Answers.** Text, ``finish_reason`` as the stop reason, ``prompt_tokens`` and
  ``completion_tokens`` as usage, and as cached input the prompt prefix llama.cpp kept from the
  previous turn (its KV cache reuses the longest common prefix, which the frozen prefix makes
  long).
- **Failures** become ProviderError in `request`, through `keel.transports.policy.attempt` like
  every transport's, none retryable (nothing here gets better by waiting): a prompt longer
  than the context window says so with both numbers; a model that cannot be found or loaded
  says what to install or fix.

`to_messages`, `from_completion` and `map_error` are pure; `LocalTransport` is the shell.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import re
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from keel.errors import ConfigError, ProviderError
from keel.local_model import INSTALL_HINT, QWEN25_CODER_05B, ensure_model
from keel.messages import ModelRequest, ModelResponse, Usage
from keel.transports.base import LocalModel
from keel.transports.policy import attempt

__all__ = [
    "DEFAULT_NAME",
    "DEFAULT_STOP",
    "REPEAT_PENALTY",
    "LlamaTokenCounter",
    "LocalTransport",
    "from_completion",
    "map_error",
    "to_messages",
]

DEFAULT_NAME = "local:qwen2.5-coder-0.5b"
REPEAT_PENALTY = 1.1
"""Greedy decoding on a 0.5B model falls into loops (the same line listed hundreds of times);
a mild penalty keeps answers readable without changing what it chooses to call."""
DEFAULT_STOP = ("<|im_end|>", "<|endoftext|>", "<|im_start|>", "</call>")
"""Chat markers, and the end of the first call block (see the module docstring)."""

_CONTROL_TOKEN = re.compile(r"<(?=\|\w{1,40}\|>)")
_DEFUSED = "<\u200b"
_CONTEXT_OVERFLOW = re.compile(r"Requested tokens \((\d+)\) exceed context window of (\d+)")


# --- to llama.cpp -----------------------------------------------------------------------------


def to_messages(request: ModelRequest) -> list[dict[str, str]]:
    """The chat messages for ``create_chat_completion`` (pure).

    Raises ConfigError for tools or tool-shaped history: those belong to the XML fallback.
    """
    if request.tools or request.tool_choice is not None:
        raise ConfigError(
            "LocalTransport is a text transport: wrap it in XmlFallbackTransport to use tools"
        )
    messages = [{"role": "system", "content": _clean(request.system)}]
    for item in request.items:
        if item.kind == "user":
            messages.append({"role": "user", "content": _clean(item.text)})
        elif item.kind == "assistant" and not item.tool_calls:
            messages.append({"role": "assistant", "content": _clean(item.text or "")})
        else:
            raise ConfigError(
                "LocalTransport received a tool call or result; wrap it in XmlFallbackTransport"
            )
    messages.extend({"role": "user", "content": _clean(text)} for text in request.volatile)
    return messages


def _clean(text: str) -> str:
    """Text as the prompt may carry it: no control-token spellings, no lone surrogates (the
    prompt is encoded as strict UTF-8), and never empty (chatml drops an empty turn's end)."""
    if "<|" in text:
        text = _CONTROL_TOKEN.sub(_DEFUSED, text)
    if not text.isascii():
        text = text.encode("utf-8", "replace").decode("utf-8")
    return text or " "


# --- from llama.cpp ---------------------------------------------------------------------------


def from_completion(data: Mapping[str, Any], *, cached_tokens: int = 0) -> ModelResponse:
    """A ``chat.completion`` dict from llama-cpp-python as a ModelResponse (pure)."""
    choices = data.get("choices") or ()
    choice: Mapping[str, Any] = choices[0] if choices else {}
    message: Mapping[str, Any] = choice.get("message") or {}
    content = message.get("content")
    usage: Mapping[str, Any] = data.get("usage") or {}
    return ModelResponse(
        text=content if isinstance(content, str) and content else None,
        usage=Usage(
            input_tokens=usage.get("prompt_tokens") or 0,
            output_tokens=usage.get("completion_tokens") or 0,
            cached_input_tokens=cached_tokens,
        ),
        stop_reason=choice.get("finish_reason"),
    )


def map_error(exc: Exception, *, n_ctx: int) -> ProviderError:
    """An exception from llama.cpp as a ProviderError; nothing here is retryable."""
    overflow = _CONTEXT_OVERFLOW.search(str(exc))
    if overflow is not None:
        prompt, window = overflow.groups()
        return ProviderError(
            f"local model: the prompt is {prompt} tokens, more than its context window of "
            f"{window} (n_ctx={n_ctx}); lower the run's context budget (--context-tokens) below "
            "the window minus the output limit, or load the model with a larger n_ctx"
        )
    if isinstance(exc, ConfigError):
        return ProviderError(f"local model unavailable: {exc}")
    return ProviderError(f"local model failed: {type(exc).__name__}: {exc}")


# --- the token counter ------------------------------------------------------------------------


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


# --- the transport ----------------------------------------------------------------------------


class LocalTransport(LocalModel):
    """The local model in this process; see the module docstring. A `LocalModel`: the run
    counts tokens with its tokenizer and keeps its context inside `input_token_limit`."""

    def __init__(
        self,
        *,
        model_path: str | None = None,
        n_ctx: int = 8192,
        n_threads: int | None = None,
        max_tokens: int = 1024,
        temperature: float = 0.0,
        seed: int = 0,
        stop: Iterable[str] = DEFAULT_STOP,
    ) -> None:
        """`model_path` loads that GGUF file as it is (no digest check); without it the shipped
        model is used. `n_threads` defaults to the machine's CPU count. Nothing is loaded here."""
        if n_ctx < 256 or max_tokens < 1 or max_tokens >= n_ctx:
            raise ConfigError(
                f"local model: need 256 <= n_ctx and 1 <= max_tokens < n_ctx "
                f"(got n_ctx={n_ctx}, max_tokens={max_tokens})"
            )
        self.name = f"local:{Path(model_path).stem}" if model_path else DEFAULT_NAME
        self.model_path = model_path
        self.n_ctx = n_ctx
        self.n_threads = n_threads or os.cpu_count() or 1
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.seed = seed
        self.stop = list(stop)
        self.load_seconds: float | None = None
        """How long loading the model took, once it has been loaded."""
        self._llama: Any = None
        self._load_lock = threading.Lock()
        self._generate_lock = threading.Lock()

    @property
    def input_token_limit(self) -> int:
        """The most prompt tokens a request may carry: the window minus the output limit. A run's
        context budget should stay below it (less a margin for the chat markers)."""
        return self.n_ctx - self.max_tokens

    def prepare(self) -> None:
        """Join, verify and load the model now instead of on the first request.

        Raises ConfigError when the model or llama-cpp-python is missing or cannot be loaded.
        """
        self._load()

    def token_counter(self) -> LlamaTokenCounter:
        """A counter using this model's tokenizer (loads the model if needed)."""
        return LlamaTokenCounter(self._load())

    async def request(self, request: ModelRequest) -> ModelResponse:
        messages = to_messages(request)
        cancel = threading.Event()
        try:
            return await attempt(
                lambda: asyncio.to_thread(self._generate, messages, cancel),
                foreign=Exception,  # llama.cpp raises whatever it likes
                to_error=lambda exc: map_error(exc, n_ctx=self.n_ctx),
                secret=None,
            )
        except asyncio.CancelledError:
            cancel.set()  # the thread ends its generation at the next token
            raise

    def close(self) -> None:
        """Let the model go; a later request loads it again. Its memory is freed at once unless
        a token counter made from it is still alive (the counter keeps it usable)."""
        with self._generate_lock, self._load_lock:  # never while a generation uses it
            self._llama = None

    # -- in the worker thread ----------------------------------------------------------------

    def _generate(self, messages: list[dict[str, str]], cancel: threading.Event) -> ModelResponse:
        with self._generate_lock:  # lock order everywhere: generate, then load
            if cancel.is_set():
                raise ProviderError("local model: the request was cancelled before it started")
            llama = self._load()  # a ConfigError becomes a ProviderError in `request`
            before = llama.input_ids[: llama.n_tokens].copy()
            data = llama.create_chat_completion(
                messages,
                max_tokens=self.max_tokens,
                temperature=self.temperature,
                seed=self.seed,
                repeat_penalty=REPEAT_PENALTY,
                stop=self.stop,
                logits_processor=[_stop_when(cancel, llama.token_eos())],
            )
            prompt_tokens = (data.get("usage") or {}).get("prompt_tokens") or 0
            # llama.cpp re-evaluates at least the prompt's last token, so that one never counts.
            kept = llama.input_ids[: min(llama.n_tokens, max(prompt_tokens - 1, 0))]
            cached = _common_prefix(before, kept)
        return from_completion(data, cached_tokens=cached)

    def _load(self) -> Any:
        with self._load_lock:
            if self._llama is None:
                path = self._resolve_path()
                llama_cpp = _import_llama_cpp()
                started = time.perf_counter()
                try:
                    self._llama = llama_cpp.Llama(
                        model_path=str(path),
                        chat_format="chatml",
                        n_ctx=self.n_ctx,
                        n_threads=self.n_threads,
                        logits_all=False,
                        verbose=False,
                    )
                except (ValueError, RuntimeError, OSError) as exc:
                    raise ConfigError(f"cannot load the local model from {path}: {exc}") from exc
                self.load_seconds = time.perf_counter() - started
            return self._llama

    def _resolve_path(self) -> Path:
        if self.model_path is None:
            return ensure_model(QWEN25_CODER_05B)
        path = Path(self.model_path)
        if not path.is_file():
            raise ConfigError(f"local model file not found: {path}")
        return path


def _import_llama_cpp() -> Any:
    try:
        return importlib.import_module("llama_cpp")
    except ImportError as exc:
        raise ConfigError(
            f"the local model needs llama-cpp-python, which is not installed: {INSTALL_HINT}"
        ) from exc


def _stop_when(cancel: threading.Event, eos: int) -> Any:
    """A logits processor that leaves only the end-of-turn token once `cancel` is set."""

    def process(input_ids: Any, scores: Any) -> Any:
        if cancel.is_set():
            scores[:] = float("-inf")
            scores[eos] = 0.0
        return scores

    return process


def _common_prefix(before: Any, after: Any) -> int:
    """Leading tokens two token arrays share (numpy arrays, compared without a Python loop)."""
    n = min(len(before), len(after))
    differ = (before[:n] != after[:n]).nonzero()[0]
    return int(differ[0]) if len(differ) else n
