"""Which API key a provider transport sends, and where: one rule for every transport (ADR 0035).

A credential goes only where the user said. The provider's key from the environment
(OPENAI_API_KEY, ANTHROPIC_API_KEY) is sent only to that provider's own host. A request to any
other server (``base_url=...``, ``--base-url``, or OPENAI_BASE_URL / ANTHROPIC_BASE_URL) carries
a key only when the user gave one for it: ``api_key=...`` in code, or ``keel run --api-key-env
NAME`` (the variable to read it from). Otherwise it carries `PLACEHOLDER_KEY`: local servers
(llama.cpp, vLLM) and keyless proxies ignore it, and the SDKs insist on having a key.

So a repository's ``keel.toml`` or a mistyped ``--base-url`` can never make Keel hand a real key
to a host the user did not choose it for.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from urllib.parse import urlsplit

from keel.errors import ConfigError

__all__ = ["PLACEHOLDER_KEY", "endpoint_key", "is_provider_host", "sent_key"]

PLACEHOLDER_KEY = "keel-no-key"
"""Sent to a user-chosen server when the user gave no key for it."""


def sent_key(api_key: str | None) -> str | None:
    """The key a transport's client sends, as one to scrub from answers: None for none, or
    for the placeholder (a word Keel made up, nobody's secret)."""
    return None if not api_key or api_key == PLACEHOLDER_KEY else api_key


def is_provider_host(base_url: str | None, provider_host: str) -> bool:
    """The requests go to the provider itself: no base URL, or one on the provider's host."""
    if not base_url:
        return True
    try:
        host = urlsplit(base_url).hostname
    except ValueError:
        return False
    return host is not None and host.lower() == provider_host


def endpoint_key(
    api_key: str | None,
    base_url: str | None,
    *,
    env_name: str,
    provider_host: str,
    provider: str,
    env: Mapping[str, str] | None = None,
) -> str:
    """The key to send to `base_url` (None: the provider's default endpoint); see the module
    docstring. The provider's own endpoint without any key is refused up front: it could only
    answer 401 after a round trip."""
    if api_key:
        return api_key
    if not is_provider_host(base_url, provider_host):
        return PLACEHOLDER_KEY
    env = os.environ if env is None else env
    key = env.get(env_name)
    if key:
        return key
    raise ConfigError(
        f"set {env_name} (or pass api_key=...) to use {provider}, or pass base_url=... "
        "(--base-url) to use a compatible server"
    )
