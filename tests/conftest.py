"""Shared fixtures. Keep each one small; add new ones beside these."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from hypothesis import settings

from pageserver import PageServer

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

pytest_plugins = ["local_model", "postgres"]  # the embedded model, llama.cpp, a Postgres cluster

# A loaded 2-core CI machine makes per-example timings meaningless; correctness is the point.
settings.register_profile("keel", deadline=None)
settings.load_profile("keel")


@pytest.fixture
def page_server() -> Iterator[PageServer]:
    """A started loopback PageServer, stopped after the test."""
    with PageServer() as server:
        yield server


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The OpenTelemetry SDK installed globally once (`in_memory_spans.install`), recording
    during this test only."""
    from in_memory_spans import EXPORTER, SWITCH, install

    install()
    EXPORTER.clear()
    SWITCH.on = True
    try:
        yield EXPORTER
    finally:
        SWITCH.on = False
        EXPORTER.clear()
