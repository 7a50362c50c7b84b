"""Shared fixtures. Keep each one small; add new ones beside these."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from hypothesis import settings

from pageserver import PageServer

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

# No test writes the store of the user running the suite: a run opened without a store of its
# own lands under XDG_DATA_HOME (platformdirs), here a folder of this test session's (and of the
# programs it starts). A developer's ~/.local/share/keel/keel.sqlite once took a newer schema
# from a branch's tests and refused every older checkout's default store afterwards.
os.environ["XDG_DATA_HOME"] = tempfile.mkdtemp(prefix="keel-tests-data-")

pytest_plugins = ["local_model", "postgres"]  # the embedded model, llama.cpp, a Postgres cluster

# A loaded 2-core CI machine makes per-example timings meaningless; correctness is the point.
settings.register_profile("keel", deadline=None)
settings.load_profile("keel")

MODEL_FIXTURES = {"local_model_path", "local_15b_path"}
"""A test that runs the embedded model (in process or behind llama.cpp's server) uses every
core the machine has: two of them at once each take twice as long, and the ones timed by the
model's silence time out (a prompt of a thousand tokens is seconds of silence)."""
TIMED_BY_THE_MACHINE = {"test_serve_hostile.py", "test_ui_live_bounds.py", "test_fault_suite.py"}
"""Files whose bounds are seconds of this machine's time, measured beside nothing else."""


@pytest.hookimpl(tryfirst=True)  # before `-m` selects on the marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """`solo`: the tests `make test` runs after the others, one at a time (the rest run on
    every core, pytest-xdist): the embedded model's and the timed ones."""
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if fixtures & MODEL_FIXTURES or item.path.name in TIMED_BY_THE_MACHINE:
            item.add_marker(pytest.mark.solo)


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
