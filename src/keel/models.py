"""Model specs: the text after `--model` names a transport and its argument."""

from __future__ import annotations

from keel.errors import ConfigError
from keel.transports.base import Transport

SPEC_HELP = "script:FILE (a scripted model, for demos and deterministic tests)"


def resolve_model(spec: str) -> Transport:
    """Turn a model spec such as ``script:demo.json`` into a transport."""
    scheme, sep, rest = spec.partition(":")
    if scheme == "script" and sep and rest:
        from keel.transports.scripted import ScriptedTransport

        return ScriptedTransport.from_file(rest)
    raise ConfigError(f"unknown model spec {spec!r}; supported: {SPEC_HELP}")
