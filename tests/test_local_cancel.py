"""Ctrl-C while the local model reads its prompt stops within a second (issue 26, ADR 0036):
the prompt was evaluated in one call that nothing could interrupt, ~29 s on two cores."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from keel.errors import ProviderError
from keel.messages import ModelRequest, UserMessage
from keel.transports.local import LocalTransport

LONG = " ".join(f"word{i}" for i in range(800))  # ~3400 tokens: seconds of evaluation


def test_a_cancel_during_prompt_evaluation_stops_it_within_a_second(
    local_transport: LocalTransport,
) -> None:
    prompt = f"<|im_start|>user\n{LONG}<|im_end|>\n<|im_start|>assistant\n"
    local_transport.prepare()
    cancel = threading.Event()
    ended: dict[str, object] = {}

    def generate() -> None:
        try:
            ended["generation"] = local_transport.generate(prompt, None, cancel)
        except ProviderError as exc:
            ended["error"] = exc
        ended["at"] = time.perf_counter()

    local_transport.close()  # an empty KV cache: the whole prompt is evaluated
    worker = threading.Thread(target=generate)
    worker.start()
    time.sleep(1.5)
    cancelled_at = time.perf_counter()
    cancel.set()
    worker.join(30)
    assert "generation" not in ended, "the prompt was evaluated to the end"
    assert "cancelled while evaluating the prompt" in str(ended["error"])
    assert float(ended["at"]) - cancelled_at < 1.0  # type: ignore[arg-type]


async def test_the_model_answers_again_after_a_cancelled_prompt(
    local_transport: LocalTransport,
) -> None:
    """An aborted evaluation leaves nothing half-done behind: the next request is answered."""
    request = ModelRequest("Answer in one word.", (), (UserMessage(LONG[:3000]),))
    task = asyncio.ensure_future(local_transport.request(request))
    await asyncio.sleep(1.0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    short = ModelRequest("Answer in one word.", (), (UserMessage("Say yes."),))
    response = await asyncio.wait_for(local_transport.request(short), 120)
    assert response.text
