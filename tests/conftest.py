"""Shared fixtures. Keep each one small; add new ones beside these."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pageserver import PageServer


@pytest.fixture
def page_server() -> Iterator[PageServer]:
    """A started loopback PageServer, stopped after the test."""
    with PageServer() as server:
        yield server
