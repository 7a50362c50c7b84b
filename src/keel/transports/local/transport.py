"""The embedded local model, in-process through llama.cpp (``llama-cpp-python``), as a transport.

`LocalTransport` speaks the model's own tool format (ADR 0027): the prompt is Qwen2.5's chat
template with its ``# Tools`` section, calls come back as ``<tool_call>`` blocks and results go
in as ``<tool_response>`` blocks (`qwen_format`, beside it in this package, pure). Every turn with
tools is sampled under a grammar built from the tool schemas (`grammar`, pure), applied by
`constrained.GrammarMask`:

- an ordinary turn can only be one well-formed call to a declared tool, with arguments that fit
  its schema, or an answer; a turn with tool_choice "required" only a call; a synthesis turn
  (tool_choice "none") only an answer, so the synthesis rule (ADR 0002) holds at the sampler:
  the model cannot ask for a tool there, whatever it prefers;
- the grammar ends after one call, so the model cannot go on to invent the result it waits for;
- strings and arrays in a call are bounded, and a call under way may run past `max_tokens`
  (up to the context window): a grammar-constrained call always ends, and always parses.

What else it does:

- **Structured output** (keel/structured.py): with `ModelRequest.output` the answer branch of
  the grammar is the answer's JSON Schema, so the model writes a call or a JSON answer that
  fits it, in every turn (even without tools).
- **Short answers**: no run of ten output tokens is written twice (`NoRepeats`), and a
  synthesis turn's answer has at most thirty lines (`keel.transports.local.answers`): the
  0.5B model's last answers otherwise repeated a sentence until the output limit cut them.
- **Code spans are copied**: once a tool has answered, every span between backticks in an
  answer is a piece of the run's own text (question, call arguments, results), and a list item
  is not listed twice (`keel.transports.local.grounding`): the 0.5B model listed a module that
  does not exist, made from a class name in the lines it had read.
- **Sampling is pinned** (`sampling`: temperature, top_p, top_k, repeat penalty, seed) and the
  seed is set again before every generation, so the same prompt gives the same output on the
  same machine. The run records `sampling` with its settings and ``keel show`` prints it.
- **Prompt caching**: one ``llama_cpp.Llama`` serves every request, and llama.cpp keeps the KV
  cache of the longest prefix the new prompt shares with the previous one; the frozen prefix
  (system text and tools, the same in synthesis turns) and the replayed history make turn N
  evaluate only what turn N-1 added. ``usage.cached_input_tokens`` says how many were reused,
  and `last_timings` how fast the rest went. ``prompt_cache=False`` evaluates every prompt
  whole (for measuring the difference).
- **Threads**: generation is blocking C code in a worker thread (`asyncio.to_thread`), one at a
  time per model (a lock valid across event loops). Cancelling the awaiting task sets an event
  that ends the generation at the next token, so the thread, the lock and the process exit are
  not held for the rest of a long generation; while the prompt is still being evaluated (a long
  prompt takes tens of seconds on two cores), llama.cpp's abort callback stops it between two
  graph nodes, within a fraction of a second (the prompt was read in one uninterruptible call:
  Ctrl-C waited ~29 s).
- **Progress**: `on_tokens`, when set, is called from the worker thread after every token with
  the count so far and the seconds since the prompt was evaluated (``keel run`` shows tokens/s).
- **Loading** is lazy, on the first request (or `prepare()`), timed in `load_seconds`; without a
  `model_path` the shipped model is joined and verified by `weights.ensure_model`.
- **Failures** become ProviderError through `keel.transports.policy.attempt`, none retryable: a
  prompt longer than the context window says so with both numbers; a model that cannot be found
  or loaded says what to install or fix.

`render_prompt`, `turn_grammar`, `read_output` and `map_error` are pure; this class is the shell.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from keel.errors import ConfigError, ProviderError
from keel.messages import ModelRequest, ModelResponse, Usage
from keel.transports import liveness
from keel.transports.base import LocalModel, PinnedSampling, SteersFirstCall
from keel.transports.local.answers import SHORT_ANSWER_RULE, NoRepeats
from keel.transports.local.grammar import turn_grammar
from keel.transports.local.grounding import Grounding, VocabularyTexts, corpus_of
from keel.transports.local.llama import (
    Generation,
    LlamaTokenCounter,
    abort_when,
    common_prefix,
    import_llama_cpp,
    map_error,
    starts_a_call,
    stop_when,
)
from keel.transports.local.qwen_format import highest_call_number, read_output, render_prompt
from keel.transports.local.steering import first_call
from keel.transports.local.stream import Pieces
from keel.transports.local.weights import DEFAULT_MODEL, MODELS, ensure_model
from keel.transports.policy import attempt
from keel.transports.streaming import OnText

__all__ = [
    "DEFAULT_NAME",
    "SAMPLING",
    "Generation",
    "LlamaTokenCounter",
    "LocalTransport",
    "ProgressCallback",
    "map_error",
]

DEFAULT_NAME = f"local:qwen2.5-coder-{DEFAULT_MODEL}"
"""The name of the default model's transport (`local`): ``local:qwen2.5-coder-1.5b``."""
SAMPLING: dict[str, float | int] = {
    "temperature": 0.0,
    "top_p": 0.8,
    "top_k": 20,
    "repeat_penalty": 1.05,
    "seed": 0,
}
"""The pinned defaults: greedy decoding (temperature 0), so a prompt has one output on a given
machine; top_p, top_k and the seed take effect with a temperature above 0. A mild repeat
penalty keeps a 0.5B model from listing the same line hundreds of times."""

ProgressCallback = Callable[[int, float], None]
"""(tokens written so far, seconds since the first of them); see `LocalTransport.on_tokens`."""

class LocalTransport(LocalModel, PinnedSampling, SteersFirstCall):
    """The local model in this process; see the module docstring. A `LocalModel`: the run
    counts tokens with its tokenizer and keeps its context inside `input_token_limit`."""

    def __init__(
        self,
        *,
        model_path: str | None = None,
        model: str = DEFAULT_MODEL,
        n_ctx: int = 8192,
        n_threads: int | None = None,
        max_tokens: int = 512,
        temperature: float = float(SAMPLING["temperature"]),
        top_p: float = float(SAMPLING["top_p"]),
        top_k: int = int(SAMPLING["top_k"]),
        repeat_penalty: float = float(SAMPLING["repeat_penalty"]),
        seed: int = int(SAMPLING["seed"]),
        prompt_cache: bool = True,
        logits_processor: Callable[[Any, Any], Any] | None = None,
        steering: bool = True,
    ) -> None:
        """`model_path` loads that GGUF file as it is (no digest check); without it the shipped
        model named `model` (a key of `keel.transports.local.weights.MODELS`: "1.5b", the
        default, or "0.5b") is used, joined and verified. `n_threads` defaults to the
        machine's CPU count.
        `logits_processor` (``(input_ids, scores) -> scores``) runs before the grammar, which has
        the last word: it can steer what the model prefers, never what the grammar forbids (the
        tests use it to make the model want a call). `steering=False` names no first call
        (`first_call`), for measuring what the steering is worth. Nothing is loaded here."""
        if n_ctx < 256 or max_tokens < 1 or max_tokens >= n_ctx:
            raise ConfigError(
                f"local model: need 256 <= n_ctx and 1 <= max_tokens < n_ctx "
                f"(got n_ctx={n_ctx}, max_tokens={max_tokens})"
            )
        if temperature < 0 or not 0 < top_p <= 1 or top_k < 1 or not 0 <= seed < 2**32 - 1:
            raise ConfigError(
                "local model: need temperature >= 0, 0 < top_p <= 1, top_k >= 1 and "
                "0 <= seed < 4294967295"
            )
        if model not in MODELS:
            raise ConfigError(
                f"local model: no shipped model {model!r}; known: {', '.join(MODELS)}"
            )
        self.model = model
        """The shipped model's name in `MODELS` (unused when `model_path` is given)."""
        if model_path:
            self.name = f"local:{Path(model_path).stem}"
        else:
            self.name = f"local:qwen2.5-coder-{model}"
        self.model_path = model_path
        self.n_ctx = n_ctx
        self.n_threads = n_threads or os.cpu_count() or 1
        self.max_tokens = max_tokens
        self.temperature, self.top_p, self.top_k = temperature, top_p, top_k
        self.repeat_penalty, self.seed = repeat_penalty, seed
        self.prompt_cache = prompt_cache
        self.steering = steering
        self.logits_processor = logits_processor
        self.on_tokens: ProgressCallback | None = None
        """Called from the worker thread after each token: (tokens so far, seconds since the
        first); for progress displays. It must be quick and must not raise."""
        self.load_seconds: float | None = None
        """How long loading the model took, once it has been loaded."""
        self.last_generation: Generation | None = None
        """The latest generation's counts and timings."""
        self._llama: Any = None
        self._vocabulary_texts: VocabularyTexts | None = None
        """The loaded model's token texts; `close` drops them with the model."""
        self._load_lock = threading.Lock()
        self._generate_lock = threading.Lock()

    @property
    def sampling(self) -> dict[str, float | int]:
        """The pinned sampling settings, recorded with each run."""
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "repeat_penalty": self.repeat_penalty,
            "seed": self.seed,
        }

    @property
    def input_token_limit(self) -> int:
        """The most prompt tokens a request may carry: the window minus the output limit. A run's
        context budget should stay below it (less a margin for the template's own text)."""
        return self.n_ctx - self.max_tokens

    def prepare(self) -> None:
        """Join, verify and load the model now instead of on the first request.

        Raises ConfigError when the model or llama-cpp-python is missing or cannot be loaded.
        """
        self._load()

    def first_call(self, question: str, tools: Collection[str]) -> str | None:
        """The call a required first turn starts with (`keel.transports.local.steering`): the
        0.5B model follows a call it is shown, and little else (`SteersFirstCall`)."""
        return first_call(question, tools) if self.steering else None

    def token_counter(self) -> LlamaTokenCounter:
        """A counter using this model's tokenizer (loads the model if needed)."""
        return LlamaTokenCounter(self._load())

    streams = True
    """It streams its answer's text to a listener (`request_streaming`, ADR 0039)."""

    async def request_streaming(self, request: ModelRequest, on_text: OnText) -> ModelResponse:
        """`request`, the answer's text handed to `on_text` as it is generated."""
        return await self.request(request, on_text)

    async def request(
        self, request: ModelRequest, on_text: OnText | None = None
    ) -> ModelResponse:
        tools = request.tools
        choice = request.tool_choice if tools else "none"
        schema = None if request.output is None else request.output.schema
        # ConfigError: misuse. With an output schema the answer is JSON in that schema; a
        # synthesis turn's prose answer is short (local_answers.py).
        grammar = None
        if choice == "none" and schema is None:
            grammar = turn_grammar((), "none", None, SHORT_ANSWER_RULE)
        elif tools or schema is not None:
            grammar = turn_grammar(tools, choice, schema)
        prompt = render_prompt(request)
        corpus = corpus_of(request.items) if choice != "required" and schema is None else ""
        cancel = threading.Event()
        pieces = None
        if on_text is not None:
            pieces = Pieces(on_text, asyncio.get_running_loop(), may_call=choice != "none")
        try:
            generation = await attempt(
                lambda: asyncio.to_thread(
                    self.generate, prompt, grammar, cancel, pieces, corpus
                ),
                foreign=Exception,  # llama.cpp raises whatever it likes
                to_error=lambda exc: map_error(exc, n_ctx=self.n_ctx),
                secret=None,
            )
        except asyncio.CancelledError:
            cancel.set()  # the thread ends its generation at the next token
            raise
        numbers = itertools.count(highest_call_number(request.items) + 1)
        text, calls = read_output(generation.text, choice, lambda: f"local_{next(numbers)}")
        return ModelResponse(
            text=text,
            tool_calls=calls,
            usage=Usage(
                generation.prompt_tokens, generation.output_tokens, generation.cached_tokens
            ),
            stop_reason=generation.stop_reason,
        )

    def close(self) -> None:
        """Let the model go; a later request loads it again. Its memory is freed at once unless
        a token counter made from it is still alive (the counter keeps it usable)."""
        with self._generate_lock, self._load_lock:  # never while a generation uses it
            self._llama = None
            self._vocabulary_texts = None

    # -- in the worker thread ----------------------------------------------------------------

    def generate(
        self,
        prompt: str,
        grammar: str | None,
        cancel: threading.Event | None = None,
        pieces: Pieces | None = None,
        corpus: str = "",
    ) -> Generation:
        """One generation for a rendered prompt, under `grammar` (GBNF) when given, its answer's
        code spans copied from `corpus` when that is not empty (`Grounding`). Blocking:
        `request` runs it in a worker thread; benchmarks call it directly."""
        with self._generate_lock:  # lock order everywhere: generate, then load
            if cancel is not None and cancel.is_set():
                raise ProviderError("local model: the request was cancelled before it started")
            llama = self._load()  # a ConfigError becomes a ProviderError in `request`
            tokens = llama.tokenize(prompt.encode("utf-8"), add_bos=False, special=True)
            if len(tokens) >= self.n_ctx:
                raise ValueError(
                    f"Requested tokens ({len(tokens)}) exceed context window of {self.n_ctx}"
                )
            if not self.prompt_cache:
                llama.reset()
            cached = min(common_prefix(llama.input_ids[: llama.n_tokens], tokens), len(tokens) - 1)
            self.last_generation = self._sample(
                llama, tokens, grammar, cancel, max(cached, 0), pieces, corpus
            )
            return self.last_generation

    def _sample(
        self,
        llama: Any,
        tokens: list[int],
        grammar: str | None,
        cancel: threading.Event | None,
        cached: int,
        pieces: Pieces | None = None,
        corpus: str = "",
    ) -> Generation:
        from keel.transports.local.constrained import GrammarMask  # numpy comes with llama.cpp

        llama_cpp = import_llama_cpp()
        vocab = llama_cpp.llama_model_get_vocab(llama.model)
        mask = GrammarMask(llama_cpp, llama, grammar, len(tokens)) if grammar else None
        opens_a_call = lambda t: mask is not None and starts_a_call(llama, t)  # noqa: E731
        grounding = None
        if corpus:
            grounding = Grounding(corpus, self._vocabulary(llama), len(tokens), opens_a_call)
        repeats = NoRepeats(len(tokens), opens_a_call)
        steps = (
            self.logits_processor,
            grounding,
            mask,
            repeats,
            stop_when(cancel, llama.token_eos()),
        )
        processors = [p for p in steps if p is not None]
        live = liveness.current()  # the gateway's, carried into this thread by to_thread
        if live is not None:
            live.started(len(tokens))
        calling = False
        llama.set_seed(self.seed)
        out: list[int] = []
        started = time.perf_counter()
        first = started
        limit, stop_reason = self.max_tokens, "length"
        abort = abort_when(llama_cpp, llama, cancel)
        try:
            for token in llama.generate(
                tokens,
                temp=self.temperature,
                top_p=self.top_p,
                top_k=self.top_k,
                min_p=0.0,
                repeat_penalty=self.repeat_penalty,
                logits_processor=processors,
            ):
                if llama_cpp.llama_vocab_is_eog(vocab, token) or llama_cpp.llama_vocab_is_control(
                    vocab, token
                ):
                    stop_reason = "stop"
                    break
                out.append(token)
                now = time.perf_counter()
                if len(out) == 1:
                    first = now
                    if mask is not None and starts_a_call(llama, token):
                        # The grammar bounds a call; let it finish inside the window.
                        limit = max(limit, self.n_ctx - len(tokens) - 1)
                        calling = True
                if live is not None:  # the timeout measures silence; an answer is kept
                    live.token(len(out), None if calling else _decoded(llama, out))
                if self.on_tokens is not None:
                    self.on_tokens(len(out), now - first)
                if pieces is not None:
                    pieces.tokens(llama, out)
                if len(out) >= limit or (cancel is not None and cancel.is_set()):
                    break
        except RuntimeError:
            if cancel is not None and cancel.is_set():  # llama_decode aborted: cancelled
                raise ProviderError(
                    "local model: cancelled while evaluating the prompt"
                ) from None
            raise
        finally:
            abort.close()
            if mask is not None:
                mask.close()
        ended = time.perf_counter()
        text = llama.detokenize(out, special=False).decode("utf-8", "replace")
        if pieces is not None:
            pieces.finish(text)
        return Generation(
            text=text,
            output_tokens=len(out),
            prompt_tokens=len(tokens),
            cached_tokens=cached,
            stop_reason=stop_reason,
            prompt_seconds=(first if out else ended) - started,
            generate_seconds=ended - first if out else 0.0,
        )

    def _vocabulary(self, llama: Any) -> VocabularyTexts:
        """The loaded model's token texts, made on first use (for `Grounding`)."""
        if self._vocabulary_texts is None:
            self._vocabulary_texts = VocabularyTexts.of_llama(llama)
        return self._vocabulary_texts

    def _load(self) -> Any:
        with self._load_lock:
            if self._llama is None:
                path = self._resolve_path()
                llama_cpp = import_llama_cpp()
                started = time.perf_counter()
                try:
                    self._llama = llama_cpp.Llama(
                        model_path=str(path),
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
            return ensure_model(MODELS[self.model])
        path = Path(self.model_path)
        if not path.is_file():
            raise ConfigError(f"local model file not found: {path}")
        return path


def _decoded(llama: Any, out: list[int]) -> str:
    """The text of the tokens so far (a character cut at the end waits for the next)."""
    data: bytes = llama.detokenize(out, special=False)
    return data.decode("utf-8", "ignore")
