"""Shared fixtures. Keep each one small; add new ones beside these."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import settings

from pageserver import PageServer

pytest_plugins = ["local_model", "postgres"]  # the embedded model, llama.cpp, a Postgres cluster

# A loaded 2-core CI machine makes per-example timings meaningless; correctness is the point.
settings.register_profile("keel", deadline=None)
settings.load_profile("keel")


@pytest.fixture
def page_server() -> Iterator[PageServer]:
    """A started loopback PageServer, stopped after the test."""
    with PageServer() as server:
        yield server
