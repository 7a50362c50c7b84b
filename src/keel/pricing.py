"""What a model call costs: a price table per provider and model, and the cost of a usage.

Keel ships a table (`keel/data/prices.toml`, with the date its prices were taken) for the
models of the providers it speaks; a trusted keel.toml's ``[prices.PROVIDER]`` tables and a
`PriceTable` passed to `Agent(prices=...)` add or replace entries. A call's cost is computed
from the usage its provider reported: input tokens served from the prompt cache at the cached
price, the other input tokens at the input price, output tokens at the output price.

A model is looked up by its spec (``openai:gpt-5-mini``, ``openai-chat:gpt-4o``,
``anthropic:claude-sonnet-4-5``, ``xml:SPEC``): the exact model id first, then the id without a
dated snapshot suffix (``gpt-4o-2024-08-06`` is priced as ``gpt-4o``). The local model and a
scripted one cost nothing; a script that names a priced model (``"model": "openai:gpt-4o"``)
is priced as that model, so tests can exercise a cost limit. Anything else has no known price:
its runs show no cost, and a cost limit refuses to start it (never a silent zero).

Provider-hosted tools (ADR 0067) are billed per call, apart from tokens: the table's
``[hosted.PROVIDER]`` gives dollars per call of each kind (``web_search = 0.01``), and a
model's `Price` carries its provider's (`Price.per_call`). A hosted kind the table does not
price has no known price, as a model without one.
"""

from __future__ import annotations

import functools
import math
import re
import tomllib
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

from keel.errors import ConfigError
from keel.messages import Usage
from keel.transports.base import Priced, Transport

__all__ = [
    "FREE",
    "PROVIDERS",
    "Price",
    "PriceTable",
    "call_cost",
    "configured_prices",
    "cost_text",
    "price_name",
]

PROVIDERS = {"openai": "openai", "openai-chat": "openai", "anthropic": "anthropic"}
"""Spec scheme -> the provider whose prices apply."""
_FREE_SCHEMES = ("local", "script")
_SNAPSHOT = re.compile(r"-(\d{4}-\d{2}-\d{2}|\d{8})$")
MILLION = 1_000_000


@dataclass(frozen=True, slots=True)
class Price:
    """US dollars per million tokens."""

    input: float
    cached_input: float
    output: float
    per_call: tuple[tuple[str, float], ...] = field(default=(), compare=False)
    """Dollars per call of each hosted tool kind the model's provider bills (ADR 0067)."""

    def __post_init__(self) -> None:
        for name in ("input", "cached_input", "output"):
            _check_dollars(getattr(self, name), f"a price's {name}")
        for kind, dollars in self.per_call:
            _check_dollars(dollars, f"the price of a {kind} call")

    def hosted(self, kind: str) -> float | None:
        """Dollars one call of a hosted `kind` costs; None: not priced."""
        return dict(self.per_call).get(kind)


def _check_dollars(value: object, what: str) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ConfigError(f"{what} must be a finite number of dollars >= 0, not {value!r}")
    if not math.isfinite(value) or value < 0:
        # NaN passes `< 0` and would make every cost (and a cost limit) NaN; inf too
        raise ConfigError(f"{what} must be a finite number of dollars >= 0, not {value!r}")


FREE = Price(0.0, 0.0, 0.0)


def call_cost(usage: Usage, price: Price) -> float:
    """Dollars one call cost: cached input at the cached price, the rest at full price."""
    cached = min(usage.cached_input_tokens, usage.input_tokens)
    return (
        (usage.input_tokens - cached) * price.input
        + cached * price.cached_input
        + usage.output_tokens * price.output
    ) / MILLION


@dataclass(frozen=True, slots=True)
class PriceTable:
    """Prices by provider and model id, and the date they were taken."""

    prices: dict[str, dict[str, Price]] = field(default_factory=dict)
    """provider ("openai", "anthropic") -> model id -> price."""
    date: str = ""
    hosted: dict[str, dict[str, float]] = field(default_factory=dict)
    """provider -> hosted tool kind -> dollars per call (ADR 0067)."""

    @classmethod
    def shipped(cls) -> PriceTable:
        """The table Keel ships (read once per process; `merged` copies, never changes it)."""
        return _shipped()

    @classmethod
    def from_toml(cls, data: dict[str, Any], where: str) -> PriceTable:
        """``{provider: {model: {input, cached_input, output}}, "date": ...,
        "hosted": {provider: {kind: dollars}}}``."""
        prices: dict[str, dict[str, Price]] = {}
        for provider, models in data.items():
            if provider in ("date", "hosted"):
                continue
            if provider not in PROVIDERS.values() or not isinstance(models, dict):
                known = ", ".join(sorted(set(PROVIDERS.values())))
                raise ConfigError(f"{where}: prices are given per provider ({known}), "
                                  f"not {provider!r}")  # fmt: skip
            prices[provider] = {
                str(model): _price(entry, f"{where}: {provider}.{model}")
                for model, entry in models.items()
            }
        return cls(prices, str(data.get("date", "")), _per_call(data.get("hosted", {}), where))

    def merged(self, other: PriceTable) -> PriceTable:
        """This table with `other`'s entries added or replacing; `other`'s date if it has one."""
        prices = {p: dict(models) for p, models in self.prices.items()}
        for provider, models in other.prices.items():
            prices.setdefault(provider, {}).update(models)
        hosted = {p: dict(kinds) for p, kinds in self.hosted.items()}
        for provider, kinds in other.hosted.items():
            hosted.setdefault(provider, {}).update(kinds)
        return PriceTable(prices, other.date or self.date, hosted)

    def lookup(self, spec: str) -> Price | None:
        """The price of a model spec's calls: FREE for local and scripted models, None when
        no price is known."""
        scheme, _, rest = spec.partition(":")
        if scheme == "xml":
            return self.lookup(rest)
        if scheme in _FREE_SCHEMES:
            return FREE
        provider = PROVIDERS.get(scheme)
        if provider is None or not rest:
            return None
        models = self.prices.get(provider, {})
        price = models.get(rest) or models.get(_SNAPSHOT.sub("", rest))
        per_call = tuple(sorted(self.hosted.get(provider, {}).items()))
        return None if price is None else replace(price, per_call=per_call)


@functools.cache
def _shipped() -> PriceTable:
    text = resources.files("keel").joinpath("data/prices.toml").read_text(encoding="utf-8")
    return PriceTable.from_toml(tomllib.loads(text), "keel/data/prices.toml")


def cost_text(cost: float | None) -> str:
    """``$0.0123``, or ``cost unknown`` for a model with no known price."""
    return "cost unknown" if cost is None else f"${cost:.4f}"


def price_name(transport: Transport) -> str:
    """The spec a transport's calls are priced as: its own name, unless it says otherwise."""
    if isinstance(transport, Priced):
        return transport.priced_as()
    return transport.name


def configured_prices(files: list[tuple[Path, dict[str, Any]]]) -> PriceTable:
    """The shipped table with each keel.toml's ``[prices]`` over it (the user's file first,
    the working directory's last, so the nearer file wins)."""
    table = PriceTable.shipped()
    for path, data in reversed(files):
        section = data.get("prices")
        if section is None:
            continue
        if not isinstance(section, dict):
            raise ConfigError(f"{path}: prices must be a table of [prices.PROVIDER] tables")
        table = table.merged(PriceTable.from_toml(section, f"{path}: prices"))
    return table


def _per_call(section: object, where: str) -> dict[str, dict[str, float]]:
    """``[hosted.PROVIDER]`` tables: dollars per call of each hosted tool kind."""
    if not isinstance(section, dict):
        raise ConfigError(f"{where}: hosted is a table of [hosted.PROVIDER] tables")
    found: dict[str, dict[str, float]] = {}
    for provider, kinds in section.items():
        if provider not in PROVIDERS.values() or not isinstance(kinds, dict):
            raise ConfigError(
                f"{where}: hosted.{provider}: hosted tools are priced per provider "
                "(anthropic, openai), { KIND = dollars per call }"
            )
        for kind, dollars in kinds.items():
            _check_dollars(dollars, f"{where}: hosted.{provider}.{kind}")
        found[provider] = {str(k): float(v) for k, v in kinds.items()}
    return found


def _price(entry: object, where: str) -> Price:
    if not isinstance(entry, dict) or set(entry) != {"input", "cached_input", "output"}:
        raise ConfigError(f"{where}: a price is {{ input = .., cached_input = .., output = .. }}")
    try:
        return Price(entry["input"], entry["cached_input"], entry["output"])
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
