"""Keel's own timeout does not leave llama-cpp-python's server generating (ADR 0065).

That server runs a whole (unstreamed) completion in a thread to its end, whoever is still
listening, and looks at the connection only between the chunks of a streamed one. So the Chat
transport streams every request to a server that is not OpenAI's, and a request its model
timeout gives up is hung up on mid-stream, which stops the server.

The runaway is made certain with the server's own ``min_tokens`` (added to the request on its
way out): the model cannot end it before its ``max_tokens``, which a prompt alone never made
sure of (asked to count to 5,000, the model stopped by itself after 47 to 291 tokens in three
whole requests of four).
Whether the server stopped is read from what it spends, not from how long the next request
waits (which, on a shared two-core machine, depends on everything else running there): after
the give-up and a grace period, the server process's CPU time over a few seconds is that of an
idle server (a few hundredths of a second), where a runaway spends whole seconds of it. Then
the next request is answered, its wait printed for the record.
"""

from __future__ import annotations

import asyncio
import json
import os
import time

import httpx
import pytest

import local_model
from keel._run.gateway import attempt
from keel.errors import ProviderError
from keel.limits import Limits
from keel.messages import ModelRequest, UserMessage
from keel.transports.openai_chat import OpenAIChatTransport

pytest_plugins = ["local_model"]

MODEL = "qwen2.5-coder-0.5b"
RUNAWAY_TOKENS = 2000
"""The runaway's length: a minute or more of generation on two cores (unstreamed, the next
request waited 109 s behind 1,500 tokens of it), so an unstopped one is still running while the
server is watched."""
GIVEN_UP_AFTER = 3.0
"""The runaway's model timeout, seconds."""
GRACE = 1.5
"""Seconds the server gets to notice its client is gone (it finishes the token it is on)."""
WATCHED = 3.0
"""Seconds the server's CPU time is watched."""
IDLE_CPU = 0.3
"""CPU seconds over `WATCHED` below which the server is idle. Idle, it spent 0.00 to 0.02 s;
generating, with two threads, several seconds, and even sharing two cores with four other
processes' busy threads it gets far more than this."""


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of process `pid`, all its threads, from /proc."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class WritesToItsLimit(httpx.AsyncBaseTransport):
    """Sends each request with ``min_tokens`` equal to its ``max_tokens`` (llama-cpp-python's
    server field: the end-of-text token is held back until then), through httpx's own."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(await request.aread())
        body["min_tokens"] = body["max_tokens"]
        headers = [(k, v) for k, v in request.headers.items() if k.lower() != "content-length"]
        again = httpx.Request(request.method, request.url, headers=headers, json=body)
        return await self.inner.handle_async_request(again)

    async def aclose(self) -> None:
        await self.inner.aclose()


def ask(text: str) -> ModelRequest:
    return ModelRequest("You are a helpful assistant.", (), (UserMessage(text),))


async def give_up_a_runaway(base_url: str) -> None:
    client = httpx.AsyncClient(transport=WritesToItsLimit())
    runaway = OpenAIChatTransport(
        MODEL, base_url=base_url, http_client=client, max_tokens=RUNAWAY_TOKENS
    )
    endless = ask("Count from 1 to 5000, one number per line, with no other text.")
    with pytest.raises(ProviderError, match="did not answer"):
        await attempt(runaway, endless, Limits(model_timeout=GIVEN_UP_AFTER), None)
    await client.aclose()


def test_a_request_given_up_by_keels_timeout_stops_llama_cpp_server(llama_server: str) -> None:
    pid = local_model.servers[llama_server].pid
    before = cpu_seconds(pid)
    asyncio.run(give_up_a_runaway(llama_server))
    assert cpu_seconds(pid) - before > 0.5, "the runaway never ran on the server"
    time.sleep(GRACE)
    start = cpu_seconds(pid)
    time.sleep(WATCHED)
    spent = cpu_seconds(pid) - start
    assert spent < IDLE_CPU, (
        f"the server spent {spent:.2f} CPU seconds in the {WATCHED:.0f} s after Keel gave the "
        "request up: it is still generating"
    )
    started = time.monotonic()
    short = OpenAIChatTransport(MODEL, base_url=llama_server, max_tokens=4)
    answer = asyncio.run(short.request(ask("Say hi.")))
    waited = time.monotonic() - started
    print(f"server CPU after the give-up: {spent:.2f} s in {WATCHED:.0f} s; next: {waited:.1f} s")
    assert answer.text
