"""A model's context window, and the context budget that fits in it (issue 44, ADR 0056).

A request larger than the window is refused by the provider, so the run's context budget
(`Limits.context_tokens`) must stay below the window less the answer's room. The window comes
from, in order:

1. the user's `Limits.context_window` (``--context-window``, ``context_window`` in keel.toml),
   for a model Keel does not know or knows wrongly;
2. the table Keel ships (`keel/data/windows.toml`, each row with its provider's page and the
   date it was written down) for the OpenAI and Anthropic models;
3. for the embedded model, what it loaded (`local_window`, from ``n_ctx``);
4. else `UNKNOWN_WINDOW`, a conservative 8,192 tokens (2,048 for the answer): an
   ``openai-chat:`` server or an ``xml:`` model may be a small local one, and a window guessed
   too small costs elided results (which the run can read back) where one guessed too large
   costs refused requests.

`context_budget` is the one formula: the smaller of the configured budget and the window less
the answer's room and a margin, never below `MIN_BUDGET`.
"""

from __future__ import annotations

import functools
import re
import tomllib
from dataclasses import dataclass
from importlib import resources
from typing import Any

from keel.errors import ConfigError
from keel.transports.base import LocalModel

__all__ = [
    "LOCAL_DEFAULT_WINDOW",
    "MIN_BUDGET",
    "SCRIPTED_WINDOW",
    "UNKNOWN_WINDOW",
    "ModelWindow",
    "WindowTable",
    "context_budget",
    "local_window",
    "window_for",
    "window_line",
]

PROVIDERS = {"openai": "openai", "openai-chat": "openai", "anthropic": "anthropic"}
"""Spec scheme -> the provider whose table applies (the same as the price table's)."""
_SNAPSHOT = re.compile(r"-(\d{4}-\d{2}-\d{2}|\d{8}|latest)$")
"""A dated snapshot or alias suffix: ``gpt-4o-2024-08-06`` has the window of ``gpt-4o``."""

MIN_BUDGET = 256
"""The smallest context budget: the system text and the question need room of their own (the
same floor as `Limits.context_tokens`)."""


@dataclass(frozen=True, slots=True)
class ModelWindow:
    """What one model can take: `context` tokens per request, prompt and answer together, of
    which the answer may use up to `output`."""

    context: int
    output: int
    source: str
    """Where the numbers come from, for a person: a provider's page, the loaded model, the
    user's setting or the default."""

    def __post_init__(self) -> None:
        numbers = (self.context, self.output)
        if any(isinstance(n, bool) or not isinstance(n, int) for n in numbers):
            raise ConfigError(f"a window's context and output are whole tokens, not {numbers}")
        if not 0 <= self.output < self.context:
            raise ConfigError(
                f"a window needs 0 <= output < context (got context={self.context}, "
                f"output={self.output}, from {self.source})"
            )

    @property
    def prompt_room(self) -> int:
        """The most tokens a prompt may take and still leave the answer its room."""
        return self.context - self.output


UNKNOWN_WINDOW = ModelWindow(
    8192, 2048, "Keel's default for a model it does not know (set --context-window)"
)
LOCAL_DEFAULT_WINDOW = ModelWindow(
    8192,
    512,
    "the embedded model's default n_ctx and output limit (local_window reads a loaded one)",
)
"""`keel.transports.local.LocalTransport`'s defaults (``n_ctx=8192``, ``max_tokens=512``), for
a ``local`` spec before a model is loaded; a test keeps the two the same."""
SCRIPTED_WINDOW = ModelWindow(
    1_000_000_000, 0, "a scripted model has no window (set --context-window to give it one)"
)
"""A script answers whatever it is sent: no window binds it unless one is configured."""

CONFIGURED_OUTPUT_SHARE = 4
"""A configured window keeps at most a quarter of itself for the answer: the known (or default)
output limit can be larger than a small window the user chose."""


@dataclass(frozen=True, slots=True)
class WindowTable:
    """Windows by provider and model id, and the date the shipped numbers were written down."""

    windows: dict[str, dict[str, ModelWindow]]
    date: str = ""

    @classmethod
    def shipped(cls) -> WindowTable:
        """The table Keel ships (read once per process)."""
        return _shipped()

    @classmethod
    def from_toml(cls, data: dict[str, Any], where: str) -> WindowTable:
        """``{provider: {model: {context, output, page}}, "date": ...}``."""
        date = str(data.get("date", ""))
        windows: dict[str, dict[str, ModelWindow]] = {}
        for provider, models in data.items():
            if provider == "date":
                continue
            if provider not in PROVIDERS.values() or not isinstance(models, dict):
                raise ConfigError(f"{where}: windows are given per provider, not {provider!r}")
            windows[provider] = {
                str(model): _window(entry, date, f"{where}: {provider}.{model}")
                for model, entry in models.items()
            }
        return cls(windows, date)

    def rows(self) -> list[tuple[str, ModelWindow]]:
        """Every model's spec (``openai:gpt-5``) and window, provider by provider."""
        return [
            (f"{provider}:{model}", window)
            for provider, models in self.windows.items()
            for model, window in models.items()
        ]

    def lookup(self, name: str) -> ModelWindow | None:
        """The window of a provider model spec or transport name (``openai:gpt-5-mini``,
        ``anthropic:claude-sonnet-4-5-20250929``, ``xml:openai-chat:gpt-4o``), or None."""
        scheme, _, model = name.partition(":")
        if scheme == "xml":
            return self.lookup(model)
        models = self.windows.get(PROVIDERS.get(scheme, ""), {})
        return models.get(model) or models.get(_SNAPSHOT.sub("", model))


def window_for(spec_or_transport_name: str, configured: int | None = None) -> ModelWindow:
    """The window a run on this model has: `configured` (`Limits.context_window`) when given,
    else the shipped table's, else the embedded model's defaults for a ``local`` spec, no window
    for a ``script:``, else `UNKNOWN_WINDOW`. For a loaded embedded model use `local_window`."""
    name = spec_or_transport_name
    known = _unconfigured(name)
    if configured is None:
        return known
    share = configured // CONFIGURED_OUTPUT_SHARE
    output = min(known.output, share) if known.output else share  # a script says none
    return ModelWindow(configured, output, "the configured context window (--context-window)")


def window_line(window: ModelWindow) -> str:
    """A window for a person: ``128,000 tokens, 16,384 of them for the answer``."""
    if window is SCRIPTED_WINDOW:
        return "none (a scripted model)"
    return f"{window.context:,} tokens, {window.output:,} of them for the answer"


def local_window(model: LocalModel) -> ModelWindow:
    """The window of an embedded model from what it loaded: ``n_ctx`` and its output limit
    (``max_tokens``), also under the XML fallback. A `LocalModel` that says only its
    `input_token_limit` gets that as the window, with the output already taken off."""
    inner = getattr(model, "inner", model)  # the XML fallback forwards the model beneath it
    n_ctx, output = getattr(inner, "n_ctx", None), getattr(inner, "max_tokens", None)
    limit = model.input_token_limit
    if isinstance(n_ctx, int) and isinstance(output, int) and n_ctx - output == limit:
        return ModelWindow(n_ctx, output, f"the loaded model's n_ctx ({n_ctx})")
    return ModelWindow(limit, 0, "the model's input token limit (its window less its answer)")


def context_budget(context_tokens: int, window: ModelWindow, margin: int) -> int:
    """The context budget a run keeps to: the configured `context_tokens`, or less where the
    window less the answer's room and `margin` (tokens the context builder does not count, such
    as chat markers and a tool format's own text) is smaller; never below `MIN_BUDGET`."""
    return max(MIN_BUDGET, min(context_tokens, window.prompt_room - margin))


def _unconfigured(name: str) -> ModelWindow:
    scheme = name.partition(":")[0]
    if scheme == "xml":
        return _unconfigured(name.partition(":")[2])
    if scheme == "local":
        return LOCAL_DEFAULT_WINDOW
    if scheme == "script":
        return SCRIPTED_WINDOW
    return WindowTable.shipped().lookup(name) or UNKNOWN_WINDOW


@functools.cache
def _shipped() -> WindowTable:
    text = resources.files("keel").joinpath("data/windows.toml").read_text(encoding="utf-8")
    return WindowTable.from_toml(tomllib.loads(text), "keel/data/windows.toml")


def _window(entry: object, date: str, where: str) -> ModelWindow:
    if not isinstance(entry, dict) or set(entry) != {"context", "output", "page"}:
        raise ConfigError(f"{where}: a window is {{ context = .., output = .., page = .. }}")
    source = f"{entry['page']} (as of {date})" if date else str(entry["page"])
    try:
        return ModelWindow(entry["context"], entry["output"], source)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
