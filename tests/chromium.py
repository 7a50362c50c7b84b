"""The skip for tests that drive a real Chromium through playwright (the `browser` extra)."""

from __future__ import annotations

import pytest

from keel.tools.browser import find_chromium

__all__ = ["HAS_PLAYWRIGHT", "needs_chromium"]

try:
    import playwright.async_api  # noqa: F401

    HAS_PLAYWRIGHT = True
except ImportError:
    HAS_PLAYWRIGHT = False

needs_chromium = pytest.mark.skipif(
    find_chromium() is None or not HAS_PLAYWRIGHT,
    reason="needs Chromium (apt-get install chromium) and playwright (pip install "
    "'keel-runtime[browser]'); CI installs both",
)
