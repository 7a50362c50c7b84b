"""Model specs: the text after `--model` names a transport and its argument.

    local                      the embedded Qwen2.5-Coder 1.5B, in-process, in its own tool format
    local:1.5b, local:0.5b     a shipped model by name (the 0.5B: the `local-0-5b` extra)
    local:PATH                 another GGUF file, in-process the same way (no digest check)
    openai:MODEL               OpenAI Responses API
    openai-chat:MODEL          Chat Completions (any compatible server with --base-url)
    anthropic:MODEL            Anthropic Messages
    xml:SPEC                   the XML tool-call fallback over any text-capable spec
    script:FILE                a scripted model, for demos and deterministic tests

Which spec a run uses when none is given: `--model`, then KEEL_MODEL, then `keel.toml` (the
working directory's, then the user config directory's), then a provider whose API key is set
(OPENAI_API_KEY, then ANTHROPIC_API_KEY), then `local`.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from keel.config import config_files, http_url, public_url
from keel.errors import ConfigError

if TYPE_CHECKING:  # the command line reads SPEC_HELP at start; a transport is built later
    from keel.hosted import HostedTool
    from keel.transports.base import ServerToolChoice, Transport

__all__ = [
    "DEFAULT_ANTHROPIC",
    "DEFAULT_OPENAI",
    "SPEC_HELP",
    "ModelChoice",
    "available_models",
    "check_base_url",
    "choose_model",
    "endpoint",
    "first_turn_tool_default",
    "model_file_line",
    "resolve_model",
]

SPEC_HELP = (
    "local, local:0.5b, local:PATH (a GGUF file), openai:MODEL, openai-chat:MODEL, "
    "anthropic:MODEL, xml:SPEC or script:FILE"
)
DEFAULT_OPENAI = "openai:gpt-5-mini"
DEFAULT_ANTHROPIC = "anthropic:claude-sonnet-4-6"
PROVIDER_SCHEMES = frozenset({"openai", "openai-chat", "anthropic"})
"""The specs that speak to a provider's server (and so take a key and a tool_choice)."""


@dataclass(frozen=True, slots=True)
class ModelChoice:
    spec: str
    base_url: str | None
    source: str
    """Where the choice came from, for `keel models` and error messages."""
    warnings: tuple[str, ...] = ()
    """Configuration that was ignored (an untrusted `keel.toml`), to tell the user."""


def check_base_url(url: str) -> str:
    """A provider endpoint must be an http(s) URL with a host: anything else is a configuration
    error now, not five retried "connection failed" model calls later."""
    http_url(url, "base URL", "http://127.0.0.1:8080/v1")
    return url


def endpoint(spec: str, base_url: str | None = None) -> str:
    """Where a spec's requests go, safe to print: the user sees where their key is sent."""
    if base_url:
        return public_url(base_url)
    scheme, _, rest = spec.partition(":")
    if scheme == "xml" and rest:
        return endpoint(rest)
    if scheme in ("openai", "openai-chat"):
        return public_url(os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1")
    if scheme == "anthropic":
        return public_url(os.environ.get("ANTHROPIC_BASE_URL") or "https://api.anthropic.com")
    if scheme == "script":
        return f"the script {rest}"
    return "this process (llama.cpp)" if scheme == "local" else "an unknown endpoint"


def resolve_model(
    spec: str,
    *,
    base_url: str | None = None,
    api_key: str | None = None,
    tool_choice: ServerToolChoice | None = None,
    hosted_tools: Sequence[HostedTool] = (),
) -> Transport:
    """Turn a model spec such as ``openai-chat:qwen`` into a transport. `api_key` and
    `tool_choice` (`keel run --api-key-env`, ``--tool-choice``) are for the provider specs
    only: anything else refuses them rather than ignore them. `hosted_tools` (``--hosted-tool``,
    ADR 0067) are for ``openai:`` and ``anthropic:`` only, each the kinds its provider hosts."""
    if base_url is not None:
        check_base_url(base_url)
    scheme, sep, rest = spec.partition(":")
    if (api_key or tool_choice) and scheme not in PROVIDER_SCHEMES:
        what = "a tool_choice (--tool-choice)" if tool_choice else "an API key (--api-key-env)"
        raise ConfigError(
            f"{what} is for openai:, openai-chat: and anthropic: specs, not {spec!r}"
            + (" (the XML fallback sends no tools)" if scheme == "xml" else "")
        )
    if hosted_tools and scheme not in ("openai", "anthropic"):
        raise ConfigError(
            f"hosted tools (--hosted-tool {hosted_tools[0].spec}) are run by OpenAI's Responses "
            f"API (openai:) or Anthropic's (anthropic:), not by {spec!r}"
        )
    if scheme == "xml" and sep and rest:
        from keel.transports.xml_fallback import XmlFallbackTransport

        return XmlFallbackTransport(resolve_model(rest, base_url=base_url))
    if scheme == "local":  # `local:1.5b`: a shipped model; `local:PATH`: a GGUF file as it is
        from keel.transports.local import LocalTransport
        from keel.transports.local.weights import DEFAULT_MODEL, MODELS

        if not rest or rest.lower() in MODELS:
            return LocalTransport(model=rest.lower() or DEFAULT_MODEL)
        return LocalTransport(model_path=str(Path(rest).expanduser()))
    if not (sep and rest):
        raise ConfigError(
            f"unknown model spec {spec!r}{_closest_spec(scheme, rest)}; supported: {SPEC_HELP}"
        )
    if scheme == "script":
        from keel.transports.scripted import ScriptedTransport

        return ScriptedTransport.from_file(rest)
    if scheme == "openai":
        from keel.transports.openai_responses import OpenAIResponsesTransport

        return OpenAIResponsesTransport(
            rest,
            base_url=base_url,
            api_key=api_key,
            tool_choice=tool_choice,
            hosted_tools=hosted_tools,
        )
    if scheme == "openai-chat":
        from keel.transports.openai_chat import OpenAIChatTransport

        return OpenAIChatTransport(
            rest, base_url=base_url, api_key=api_key, tool_choice=tool_choice
        )
    if scheme == "anthropic":
        from keel.transports.anthropic import AnthropicTransport

        return AnthropicTransport(
            rest,
            base_url=base_url,
            api_key=api_key,
            tool_choice=tool_choice,
            hosted_tools=hosted_tools,
        )
    raise ConfigError(
        f"unknown model spec {spec!r}{_closest_spec(scheme, rest)}; supported: {SPEC_HELP}"
    )


_SCHEMES = ("local", "openai", "openai-chat", "anthropic", "xml", "script")


def _closest_spec(scheme: str, rest: str) -> str:
    """`lcoal` -> "; did you mean 'local'?", `opnai:gpt-5` -> 'openai:gpt-5', as keel.toml keys
    get; empty when no spec is close."""
    close = difflib.get_close_matches(scheme.lower(), _SCHEMES, n=1, cutoff=0.6)
    if not close:
        return ""
    name = close[0]
    blank = {"local": "", "script": ":FILE", "xml": ":SPEC"}.get(name, ":MODEL")
    tail = f":{rest}" if rest else blank
    return f"; did you mean {name + tail!r}?"


def choose_model(
    spec: str | None = None,
    base_url: str | None = None,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> ModelChoice:
    """The spec a run will use, and why."""
    env = os.environ if env is None else env
    if spec:
        return ModelChoice(spec, base_url, "--model")
    if env.get("KEEL_MODEL"):
        return ModelChoice(env["KEEL_MODEL"], base_url or env.get("KEEL_BASE_URL"), "KEEL_MODEL")
    files, warnings = config_files(cwd)
    for found in files:
        path, data = found.path, found.data
        model, url = data.get("model"), data.get("base_url")
        if model is not None and not isinstance(model, str):
            raise ConfigError(f'{path}: model must be a string such as "local"')
        if url is not None and not isinstance(url, str):
            raise ConfigError(f"{path}: base_url must be a string")
        if model:
            return ModelChoice(model, base_url or url, str(path), tuple(warnings))
    if env.get("OPENAI_API_KEY"):
        return ModelChoice(DEFAULT_OPENAI, base_url, "OPENAI_API_KEY is set", tuple(warnings))
    if env.get("ANTHROPIC_API_KEY"):
        return ModelChoice(DEFAULT_ANTHROPIC, base_url, "ANTHROPIC_API_KEY is set", tuple(warnings))
    return ModelChoice("local", base_url, "the embedded default", tuple(warnings))


def available_models(env: Mapping[str, str] | None = None) -> list[tuple[str, bool, str]]:
    """(spec, usable here, why) for `keel models`: each shipped local model with its file, size
    and whether its parts are installed, then the other specs."""
    import importlib.util

    from keel.transports.local.weights import DEFAULT_MODEL, MODELS, install_hint, is_installed

    env = os.environ if env is None else env
    llama = importlib.util.find_spec("llama_cpp") is not None
    shipped: list[tuple[str, bool, str]] = []
    for name, model in MODELS.items():
        ready = llama and is_installed(model)
        spec = "local" if name == DEFAULT_MODEL else f"local:{name}"
        state = "installed" if ready else f"not installed: {install_hint(model)}"
        note = f"{model.label}, {model.filename} ({model.size / 2**20:,.0f} MiB); {state}"
        shipped.append((spec, ready, note))
    openai_key = bool(env.get("OPENAI_API_KEY"))
    anthropic_key = bool(env.get("ANTHROPIC_API_KEY"))
    return [
        *shipped,
        (
            "local:PATH",
            llama,
            "a GGUF file in Qwen2.5's chat and tool format, loaded as it is",
        ),
        (
            "openai:MODEL",
            openai_key,
            "OPENAI_API_KEY is set" if openai_key else "set OPENAI_API_KEY",
        ),
        ("openai-chat:MODEL", True, "with --base-url any compatible server; else OPENAI_API_KEY"),
        (
            "anthropic:MODEL",
            anthropic_key,
            "ANTHROPIC_API_KEY is set" if anthropic_key else "set ANTHROPIC_API_KEY",
        ),
        ("xml:SPEC", True, "XML tool calls over any text model"),
        ("script:FILE", True, "a scripted model (tests, demos)"),
    ]


def first_turn_tool_default(spec: str) -> bool:
    """Whether a run on this model insists that its first turn calls a tool when the command
    line does not say: yes for the local model (`local`, `local:PATH`), which without it answers
    from nothing and invents (issue 25), no for the others (`--first-turn-tool` asks it)."""
    return spec.partition(":")[0] == "local"


def model_file_line(spec: str = "local") -> str:
    """Where the local model's GGUF file is and how big, for `keel models`: the file a
    `local:PATH` spec names, else the shipped model's joined file in the cache folder (the
    default one, or the one a `local:1.5b` spec names)."""
    from keel.transports.local.weights import DEFAULT_MODEL, MODELS, joined_file

    _, _, given = spec.partition(":") if spec.startswith("local:") else ("", "", "")
    shipped = MODELS.get(given.lower() or DEFAULT_MODEL)
    path = joined_file(shipped) if shipped is not None else Path(given).expanduser()
    given = "" if shipped is not None else given
    try:
        size = path.stat().st_size
    except OSError:
        if given:
            return f"{path} (not found)"
        return f"{path} (not joined yet: the first local run joins it from the part packages)"
    return f"{path} ({size:,} bytes, {size / 2**20:.0f} MiB)"
