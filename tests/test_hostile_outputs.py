"""What comes from outside a run cannot crash it, hang it or leak through it (issue 33).

The caller's output schema, the model's answer to it, the live answer file's folder, a price
table and the API key a run was given each get a case here: every one ends in a refusal at
start, a classified failure or a bounded cost, never a traceback, a hang or a run left
`running` (ADR 0048).
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path

import pytest

import keel
from keel.pricing import Price, PriceTable, configured_prices

# --- prices ----------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_price_that_is_not_a_finite_number_is_refused(bad: float) -> None:
    with pytest.raises(keel.ConfigError, match="finite"):
        Price(bad, 0.0, 0.0)
    with pytest.raises(keel.ConfigError, match=r"openai\.house"):
        PriceTable.from_toml({"openai": {"house": {"input": 1.0, "cached_input": bad,
                                                   "output": 1.0}}}, "mine")  # fmt: skip


@pytest.mark.parametrize("word", ["nan", "inf", "+inf", "-nan"])
def test_a_keel_toml_price_of_nan_or_inf_is_refused_at_start(tmp_path: Path, word: str) -> None:
    toml = tmp_path / "keel.toml"
    toml.write_text(f'[prices.openai]\n"gpt-4o" = {{ input = 1.0, cached_input = 0.1, '
                    f"output = {word} }}\n")  # fmt: skip
    with pytest.raises(keel.ConfigError, match=r"gpt-4o.*finite"):
        configured_prices([(toml, tomllib.loads(toml.read_text()))])
