"""The run core asks the transport for a required first turn's call (`SteersFirstCall`, issue
31): the local model's question-word rules live with it (keel/transports/local/steering.py),
the XML fallback forwards them, and a transport without the capability gets the general
first-turn control only."""

from __future__ import annotations

from pathlib import Path

import keel
from keel._run.synthesis import FIRST_CALL_CONTROL
from keel.messages import ModelRequest, ModelResponse
from keel.transports.base import SteersFirstCall
from keel.transports.local import LocalTransport
from keel.transports.local.steering import first_call
from keel.transports.xml_fallback import XmlFallbackTransport

QUESTION = "Which modules does src/keel/_run/loop.py import?"
TOOLS = {"list_files", "read_file", "search_files"}


class Remote:
    """A transport with no capability: it records what it was sent, answers at once."""

    name = "remote"

    def __init__(self) -> None:
        self.requests: list[ModelRequest] = []

    async def request(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        return ModelResponse("The loop imports asyncio.")


def test_the_local_transport_steers_its_first_call_by_its_rules() -> None:
    local = LocalTransport(n_ctx=1024, max_tokens=24)  # loads nothing
    assert isinstance(local, SteersFirstCall)
    assert local.first_call(QUESTION, TOOLS) == first_call(QUESTION, TOOLS) is not None


def test_the_xml_fallback_forwards_the_steering_of_the_transport_it_wraps() -> None:
    over_local = XmlFallbackTransport(LocalTransport(n_ctx=1024, max_tokens=24))
    assert isinstance(over_local, SteersFirstCall)
    assert over_local.first_call(QUESTION, TOOLS) == first_call(QUESTION, TOOLS)
    assert not isinstance(XmlFallbackTransport(Remote()), SteersFirstCall)
    assert type(XmlFallbackTransport(Remote())) is XmlFallbackTransport


async def test_a_transport_that_does_not_steer_gets_the_general_control(tmp_path: Path) -> None:
    (tmp_path / "loop.py").write_text("import asyncio\n")
    remote = Remote()
    limits = keel.Limits(first_turn_tool=True)
    with keel.Agent(remote, tools=keel.file_tools(tmp_path), limits=limits, store=":memory:") as a:
        await a.arun("What does loop.py import?")
    assert not isinstance(remote, SteersFirstCall)
    assert remote.requests[0].volatile == (FIRST_CALL_CONTROL,)
