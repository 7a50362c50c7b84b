"""The gateway's timeout for a transport that reports its tokens (`keel.transports.liveness`):
silence, not the whole call; an answer written before a timeout is kept, cut off."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from keel._run import gateway
from keel.errors import ProviderError
from keel.limits import Limits
from keel.messages import ModelRequest, ModelResponse, UserMessage
from keel.transports import liveness

REQUEST = ModelRequest("system", (), (UserMessage("question"),))


class Writer:
    """Reports `count` tokens from a worker thread, `gap` seconds apart, then stays silent for
    `silence` seconds, then answers; `answer=False` reports a call being written."""

    name = "writer"

    def __init__(self, count: int, gap: float, silence: float = 0.0, answer: bool = True):
        self.count, self.gap, self.silence, self.answer = count, gap, silence, answer

    async def request(self, request: ModelRequest) -> ModelResponse:
        return await asyncio.to_thread(self._write)

    def _write(self) -> ModelResponse:
        live = liveness.current()
        assert live is not None  # carried into the thread
        live.started(12)
        text = ""
        for n in range(1, self.count + 1):
            time.sleep(self.gap)
            text += f"w{n} "
            live.token(n, text if self.answer else None)
        time.sleep(self.silence)
        return ModelResponse(text=text, stop_reason="stop")


async def test_tokens_keep_a_call_alive_past_the_timeout() -> None:
    started = time.monotonic()
    response = await gateway.attempt(Writer(12, 0.05), REQUEST, Limits(model_timeout=0.25), None)
    assert time.monotonic() - started > 0.5  # twice the timeout, and not timed out
    assert response.stop_reason == "stop" and not response.cut_off
    assert response.text is not None and response.text.split()[-1] == "w12"


async def test_a_silence_keeps_the_answer_written_so_far_as_cut_off() -> None:
    response = await gateway.attempt(
        Writer(3, 0.02, silence=1.0), REQUEST, Limits(model_timeout=0.25), None
    )
    assert (response.text, response.stop_reason, response.cut_off) == ("w1 w2 w3", "timeout", True)
    assert (response.usage.input_tokens, response.usage.output_tokens) == (12, 3)


async def test_a_silence_while_writing_a_call_is_a_retryable_timeout() -> None:
    with pytest.raises(ProviderError, match=r"wrote no token for 0\.2s") as info:
        await gateway.attempt(
            Writer(3, 0.02, silence=1.0, answer=False), REQUEST, Limits(model_timeout=0.2), None
        )
    assert info.value.retryable


async def test_the_runs_deadline_still_bounds_the_whole_call() -> None:
    started = time.monotonic()
    with pytest.raises(ProviderError, match="the run's deadline"):
        await gateway.attempt(
            Writer(40, 0.05, answer=False), REQUEST, Limits(model_timeout=0.25), remaining=0.4
        )
    assert time.monotonic() - started < 1.0


async def test_a_transport_that_reports_nothing_is_timed_as_a_whole() -> None:
    class Silent:
        name = "silent"

        async def request(self, request: ModelRequest) -> ModelResponse:
            await asyncio.sleep(5)
            return ModelResponse(text="late")

    with pytest.raises(ProviderError, match=r"did not answer within 0\.2s \(model_timeout\)"):
        await gateway.attempt(Silent(), REQUEST, Limits(model_timeout=0.2), None)


def test_liveness_outside_a_call_is_none_and_tokens_after_it_are_harmless() -> None:
    assert liveness.current() is None
    seen: list[int] = []
    live = liveness.Liveness(on_token=lambda: seen.append(1))
    threads = [threading.Thread(target=live.token, args=(n, "x")) for n in range(5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(seen) == 5 and live.kept() == "x" and live.last is not None
