"""Model windows and the context budget that fits in them (keel/windows.py, issue 44): the
shipped table, the configured window, the embedded model's, the default for unknown models, and
`--context-window` as an option like any limit."""

from __future__ import annotations

import fnmatch
import tomllib
from importlib import resources
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from keel.config import trust
from keel.errors import ConfigError
from keel.limits import Limits
from keel.models import DEFAULT_ANTHROPIC, DEFAULT_OPENAI
from keel.pricing import PriceTable
from keel.run_options import resolve
from keel.tokens import TokenCounter
from keel.transports.local import LocalTransport
from keel.transports.openai_chat import OpenAIChatTransport
from keel.transports.xml_fallback import XmlFallbackTransport
from keel.windows import (
    LOCAL_DEFAULT_WINDOW,
    MIN_BUDGET,
    SCRIPTED_WINDOW,
    UNKNOWN_WINDOW,
    ModelWindow,
    WindowTable,
    context_budget,
    local_window,
    window_for,
)

ROOT = Path(__file__).resolve().parents[1]


def _shipped_rows() -> dict[str, dict[str, dict[str, object]]]:
    text = resources.files("keel").joinpath("data/windows.toml").read_text(encoding="utf-8")
    data = tomllib.loads(text)
    return {k: v for k, v in data.items() if isinstance(v, dict)}


def test_every_row_of_the_table_has_a_window_larger_than_its_output_and_a_page() -> None:
    rows = _shipped_rows()
    assert set(rows) == {"openai", "anthropic"}
    for provider, models in rows.items():
        for model, row in models.items():
            where = f"{provider}.{model}"
            assert isinstance(row["context"], int) and isinstance(row["output"], int), where
            assert row["context"] > row["output"] > 0, where
            assert str(row["page"]).startswith("https://"), where
    assert WindowTable.shipped().date  # the day the numbers were written down


def test_the_table_knows_every_priced_model_and_both_default_models() -> None:
    table = WindowTable.shipped()
    priced = PriceTable.shipped().prices
    missing = [
        f"{provider}:{model}"
        for provider, models in priced.items()
        for model in models
        if table.lookup(f"{provider}:{model}") is None
    ]
    assert missing == []
    for spec in (DEFAULT_OPENAI, DEFAULT_ANTHROPIC):
        assert table.lookup(spec) is not None, spec


def test_the_table_ships_in_the_package() -> None:
    """pyproject's package data takes the file with the price table."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["keel"]
    assert any(fnmatch.fnmatch("data/windows.toml", p) for p in patterns)


@pytest.mark.parametrize(
    ("name", "context", "output"),
    [
        ("openai:gpt-5-mini", 400_000, 128_000),
        ("openai-chat:gpt-4o", 128_000, 16_384),
        ("openai:gpt-4o-2024-08-06", 128_000, 16_384),  # a dated snapshot: its model's row
        ("anthropic:claude-sonnet-4-5-20250929", 200_000, 64_000),
        ("anthropic:claude-3-5-haiku-latest", 200_000, 8_192),
        ("xml:openai-chat:gpt-4.1-mini", 1_047_576, 32_768),
    ],
)
def test_known_models_have_the_tables_window(name: str, context: int, output: int) -> None:
    window = window_for(name)
    assert (window.context, window.output) == (context, output)
    assert window.source.startswith("https://")


@pytest.mark.parametrize(
    "name", ["openai-chat:qwen2.5-coder-7b", "xml:openai-chat:llama3", "openai:gpt-9", "ollama:x"]
)
def test_a_model_keel_does_not_know_gets_the_conservative_default(name: str) -> None:
    assert window_for(name) == UNKNOWN_WINDOW
    assert (UNKNOWN_WINDOW.context, UNKNOWN_WINDOW.output) == (8192, 2048)


def test_the_configured_window_wins_and_keeps_room_for_the_answer() -> None:
    mine = window_for("openai-chat:qwen2.5-coder-7b", configured=32_768)
    assert (mine.context, mine.output) == (32_768, 2048)
    assert "--context-window" in mine.source
    smaller = window_for("openai:gpt-5", configured=16_384)  # the table's 128K output won't fit
    assert (smaller.context, smaller.output) == (16_384, 4096)
    assert window_for("anthropic:claude-opus-4-1", configured=500_000).output == 32_000
    scripted = window_for("script:run.json", configured=4096)  # a script keeps no room: a quarter
    assert scripted == ModelWindow(4096, 1024, mine.source)


def test_scripts_have_no_window_and_local_specs_the_embedded_models_defaults() -> None:
    assert window_for("script:tests/fixtures/x.json") == SCRIPTED_WINDOW
    assert window_for("local") == window_for("local:1.5b") == LOCAL_DEFAULT_WINDOW
    transport = LocalTransport()  # nothing is loaded
    assert (LOCAL_DEFAULT_WINDOW.context, LOCAL_DEFAULT_WINDOW.output) == (
        transport.n_ctx,
        transport.max_tokens,
    )


def test_the_embedded_models_window_is_the_one_it_loads_also_under_xml() -> None:
    transport = LocalTransport(n_ctx=4096, max_tokens=256)
    assert (local_window(transport).context, local_window(transport).output) == (4096, 256)
    wrapped = XmlFallbackTransport(transport)
    assert local_window(wrapped) == local_window(transport)


def test_a_local_model_that_says_only_its_input_limit_gets_that_as_its_window() -> None:
    class Limited:
        input_token_limit = 3000

        def token_counter(self) -> TokenCounter:
            raise NotImplementedError

    window = local_window(Limited())
    assert (window.context, window.output, window.prompt_room) == (3000, 0, 3000)


def test_the_budget_is_the_smaller_of_the_configured_budget_and_the_window_less_its_room() -> None:
    gpt_4o = window_for("openai:gpt-4o")
    assert context_budget(100_000, gpt_4o, 700) == 100_000  # the window is larger
    assert context_budget(200_000, gpt_4o, 700) == 128_000 - 16_384 - 700
    assert context_budget(100_000, UNKNOWN_WINDOW, 700) == 8192 - 2048 - 700
    tiny = ModelWindow(1024, 512, "a tiny model")
    assert context_budget(100_000, tiny, 700) == MIN_BUDGET  # never below the floor


@given(
    st.integers(min_value=256, max_value=10**7),
    st.integers(min_value=2, max_value=10**7),
    st.integers(min_value=0, max_value=10**6),
    st.integers(min_value=0, max_value=10**5),
)
def test_the_budget_never_passes_the_window_nor_the_configured_budget_nor_the_floor(
    context_tokens: int, context: int, output: int, margin: int
) -> None:
    window = ModelWindow(context, min(output, context - 1), "hypothesis")
    budget = context_budget(context_tokens, window, margin)
    assert budget >= MIN_BUDGET
    assert budget <= context_tokens
    if window.prompt_room - margin >= MIN_BUDGET:
        assert budget <= window.prompt_room - margin


@pytest.mark.parametrize(("context", "output"), [(0, 0), (1000, 1000), (1000, -1), (True, 0)])
def test_a_window_that_leaves_no_room_is_refused(context: int, output: int) -> None:
    with pytest.raises(ConfigError):
        ModelWindow(context, output, "wrong")


def test_a_table_row_of_the_wrong_shape_names_itself() -> None:
    with pytest.raises(ConfigError, match=r"x.toml: openai.gpt-x"):
        WindowTable.from_toml(
            {"openai": {"gpt-x": {"context": 10, "output": 20, "page": "p"}}}, "x.toml"
        )
    with pytest.raises(ConfigError, match="per provider"):
        WindowTable.from_toml({"mistral": {}}, "x.toml")


def test_a_configured_window_is_a_limit_from_the_flag_the_environment_or_keel_toml(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    assert Limits().context_window is None
    chosen = resolve({"context_window": 32_768}, cwd=tmp_path, env={})
    assert chosen.limits().context_window == 32_768
    assert chosen.saved()["context_window"] == {"from": "--context-window", "value": 32_768}
    chosen = resolve({}, cwd=tmp_path, env={"KEEL_CONTEXT_WINDOW": "16384"})
    assert chosen.limits().context_window == 16_384
    (tmp_path / "keel.toml").write_text("context_window = 65536\n")
    trust(tmp_path)
    assert resolve({}, cwd=tmp_path, env={}).limits().context_window == 65_536
    assert Limits(context_window=8192).to_dict()["context_window"] == 8192  # saved with the run


def test_a_configured_window_below_1024_tokens_is_refused() -> None:
    with pytest.raises(ConfigError, match="context window must be at least 1024"):
        Limits(context_window=512)


def test_a_compatible_server_is_named_by_its_spec() -> None:
    """The name the run looks a window up by is the transport's, the spec it was made from."""
    transport = OpenAIChatTransport("qwen2.5-coder", base_url="http://127.0.0.1:8080/v1")
    assert window_for(transport.name) == UNKNOWN_WINDOW


def test_keel_models_prints_each_known_models_window_and_the_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from keel.cli.app import app

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    for name in ("KEEL_MODEL", "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "KEEL_CONTEXT_WINDOW"):
        monkeypatch.delenv(name, raising=False)
    env = {"KEEL_MODEL": "openai-chat:qwen2.5-coder", "KEEL_CONTEXT_WINDOW": "32768"}
    result = CliRunner().invoke(app, ["models"], env=env)
    assert result.exit_code == 0, result.output
    lines = [" ".join(line.split()) for line in result.stdout.splitlines()]
    assert "its window: 32,768 tokens, 2,048 of them for the answer" in lines
    assert "openai:gpt-4o 128,000 tokens, 16,384 of them for the answer" in lines
    assert "anthropic:claude-3-5-haiku 200,000 tokens, 8,192 of them for the answer" in lines
    assert "any model not listed 8,192 tokens, 2,048 of them for the answer" in lines
