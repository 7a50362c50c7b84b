"""`keel eval --model local` builds a local model per run; each is closed when its run ends, so
a long evaluation does not hold every model it ever loaded (4.6 GB after 18 live runs).
A LocalTransport whose generation is replaced stands in for the model: nothing is loaded."""

from __future__ import annotations

from typing import Any

import pytest

import keel.evals.runner as runner
import keel.tokens
from keel.evals.loading import resolve
from keel.messages import ModelRequest, ModelResponse
from keel.store import Store
from keel.transports.local import LocalTransport


class Answering(LocalTransport):
    made: list[Answering] = []  # noqa: RUF012 - a record of every instance, for the test

    def __init__(self) -> None:
        super().__init__(n_ctx=1024, max_tokens=16)
        self.closed = False
        Answering.made.append(self)

    def token_counter(self) -> Any:
        return keel.tokens.EstimatingCounter()

    async def request(self, request: ModelRequest) -> ModelResponse:
        return ModelResponse("The job finished.")

    def close(self) -> None:
        self.closed = True
        super().close()


async def test_each_live_run_closes_its_local_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "make_transport", lambda *args: Answering())
    scenario = resolve(["changing_page"])[0]
    store = Store(":memory:")
    try:
        for n in (1, 2):
            row = await runner.run_once(scenario, model="local", store=store, repeat=n)
            assert row.actual == "answer", row.problems
    finally:
        store.close()
    assert len(Answering.made) == 2
    assert all(t.closed for t in Answering.made)
