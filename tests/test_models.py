"""Choosing a model: --model, KEEL_MODEL, keel.toml, provider keys, then the local default."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from keel.config import trust
from keel.errors import ConfigError
from keel.models import choose_model, resolve_model
from keel.transports.anthropic import AnthropicTransport
from keel.transports.openai_chat import OpenAIChatTransport
from keel.transports.openai_responses import OpenAIResponsesTransport
from keel.transports.scripted import ScriptedTransport
from keel.transports.xml_fallback import XmlFallbackTransport


@pytest.fixture(autouse=True)
def own_config_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The user's config folder (where `keel trust` records trust), inside the test."""
    folder = tmp_path / "config"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(folder))
    return folder / "keel"


def test_model_choice_order(tmp_path: Path) -> None:
    home = tmp_path / "nowhere"
    home.mkdir()
    assert choose_model(env={}, cwd=home).spec == "local"
    assert choose_model(env={"ANTHROPIC_API_KEY": "k"}, cwd=home).spec.startswith("anthropic:")
    keys = {"ANTHROPIC_API_KEY": "k", "OPENAI_API_KEY": "k"}
    assert choose_model(env=keys, cwd=home).spec.startswith("openai:")
    (home / "keel.toml").write_text(
        'model = "openai-chat:qwen"\nbase_url = "http://127.0.0.1:9/v1"\n'
    )
    ignored = choose_model(env=keys, cwd=home)  # a working-directory file is not trusted yet
    assert ignored.spec.startswith("openai:") and "keel trust" in ignored.warnings[0]
    trust(home)
    chosen = choose_model(env=keys, cwd=home)
    assert (chosen.spec, chosen.base_url) == ("openai-chat:qwen", "http://127.0.0.1:9/v1")
    assert chosen.source.endswith("keel.toml")
    assert choose_model(env={**keys, "KEEL_MODEL": "xml:local"}, cwd=home).spec == "xml:local"
    assert choose_model("script:x.json", env={"KEEL_MODEL": "local"}, cwd=home).spec == (
        "script:x.json"
    )


def test_broken_config_file_is_a_clear_error(tmp_path: Path, own_config_dir: Path) -> None:
    own_config_dir.mkdir(parents=True)
    (own_config_dir / "keel.toml").write_text("model = [1")
    with pytest.raises(ConfigError, match=r"keel\.toml"):
        choose_model(env={}, cwd=tmp_path)
    (own_config_dir / "keel.toml").write_text("model = 3")
    with pytest.raises(ConfigError, match="must be a string"):
        choose_model(env={}, cwd=tmp_path)
    (tmp_path / "keel.toml").write_text("model = [1")
    with pytest.raises(ConfigError, match="cannot read"):
        trust(tmp_path)  # nothing unreadable is trusted


def test_specs_resolve_to_their_transports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    script = tmp_path / "s.json"
    script.write_text('{"turns": [{"text": "hi"}]}')
    assert isinstance(resolve_model("openai:gpt-x"), OpenAIResponsesTransport)
    assert isinstance(
        resolve_model("openai-chat:m", base_url="http://127.0.0.1:1/v1"), OpenAIChatTransport
    )
    assert isinstance(resolve_model("anthropic:claude-x"), AnthropicTransport)
    assert isinstance(resolve_model(f"script:{script}"), ScriptedTransport)
    wrapped = resolve_model("xml:openai-chat:m")
    assert isinstance(wrapped, XmlFallbackTransport) and wrapped.name == "xml:openai-chat:m"
    for bad in ("gpt-4", "openai:", "xml:"):  # "local:NAME" is a GGUF file (test_first_steps)
        with pytest.raises(ConfigError, match="unknown model spec"):
            resolve_model(bad)


def test_missing_provider_key_is_a_configuration_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        resolve_model("openai:gpt-x")
    with pytest.raises(ConfigError, match="ANTHROPIC_API_KEY"):
        resolve_model("anthropic:claude-x")


@pytest.mark.parametrize(
    ("spec", "hint"),
    [
        ("lcoal", "did you mean 'local'?"),
        ("opnai:gpt-5-mini", "did you mean 'openai:gpt-5-mini'?"),
        ("anthropic", "did you mean 'anthropic:MODEL'?"),
        ("opeanai-chat:qwen", "did you mean 'openai-chat:qwen'?"),
    ],
)
def test_an_unknown_model_spec_names_the_closest_spec(spec: str, hint: str) -> None:
    with pytest.raises(ConfigError, match=f"unknown model spec .*{re.escape(hint)}"):
        resolve_model(spec)
