"""llama-cpp-python's server, which serves one request at a time, is free for the next request
soon after Keel's model timeout gives one up (ADR 0065): the request went out streamed (the
transport's default for a server that is not OpenAI's), and that server stops generating when a
streamed request's client goes away; a whole request would run on in its thread to its limit."""

from __future__ import annotations

import asyncio
import time

import pytest

from keel._run.gateway import attempt
from keel.errors import ProviderError
from keel.limits import Limits
from keel.messages import ModelRequest, UserMessage
from keel.transports.openai_chat import OpenAIChatTransport

pytest_plugins = ["local_model"]

RUNAWAY_TOKENS = 1500
"""The runaway's output limit: about a minute of generation on two loaded cores (unstreamed,
the next request waited 61 s behind it; streamed, 11 to 12 s, its own time under load)."""
FREED_WITHIN = 20.0
"""Seconds the next short request may take, its own generation included."""


def _ask(text: str) -> ModelRequest:
    return ModelRequest("You are a helpful assistant.", (), (UserMessage(text),))


async def _given_up_then_next(base_url: str) -> float:
    runaway = OpenAIChatTransport(
        "qwen2.5-coder-0.5b", base_url=base_url, max_tokens=RUNAWAY_TOKENS
    )
    assert runaway.stream == "always"
    long = _ask("Count from 1 to 3000, one number per line, with no other text.")
    with pytest.raises(ProviderError, match="did not answer"):
        await attempt(runaway, long, Limits(model_timeout=3.0), None)
    started = time.monotonic()
    short = OpenAIChatTransport("qwen2.5-coder-0.5b", base_url=base_url, max_tokens=4)
    answer = await short.request(_ask("Say hi."))
    assert answer.usage.estimated and answer.usage.output_tokens > 0
    return time.monotonic() - started


def test_a_timed_out_streamed_request_frees_llama_cpp_server_for_the_next(
    llama_server: str,
) -> None:
    waited = asyncio.run(_given_up_then_next(llama_server))
    assert waited < FREED_WITHIN, f"the next request waited {waited:.1f}s behind the runaway"
