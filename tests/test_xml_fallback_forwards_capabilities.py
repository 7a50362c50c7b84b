"""The XML wrapper offers exactly what its inner transport offers (`keel.transports.base`).

``xml:script:FILE`` must pause and resume like ``script:FILE`` (the script continues at the turn
it stood at, not at turn 0), and ``xml:local`` must give the run the local model's tokenizer and
input window. A wrapper over a transport without those capabilities must not claim them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import keel
from keel._run import Opened
from keel.messages import ModelRequest, ModelResponse
from keel.models import resolve_model
from keel.tokens import CalibratedCounter, EstimatingCounter, TokenCounter
from keel.transports.base import LocalModel, Resumable, Transport
from keel.transports.local import LocalTransport
from keel.transports.scripted import ScriptedTransport
from keel.transports.xml_fallback import XmlFallbackTransport
from keel.windows import UNKNOWN_WINDOW, context_budget

WRITE = '<call name="write_file">{"path": "out.txt", "content": "hello\\n"}</call>'
ANSWER = "Done: the note is written."


def write_script(tmp_path: Path, *texts: str) -> Path:
    path = tmp_path / "script.json"
    path.write_text(json.dumps({"turns": [{"text": text} for text in texts]}))
    return path


def agent(spec: str, repo: Path, store: keel.Store) -> keel.Agent:
    tools: list[Any] = [*keel.file_tools(repo), *keel.write_tools(repo)]
    return keel.Agent(spec, tools=tools, store=store)


async def test_an_xml_script_run_resumed_after_a_pause_continues_at_its_next_turn(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    spec = f"xml:script:{write_script(tmp_path, WRITE, ANSWER)}"
    store = keel.Store(tmp_path / "runs.sqlite")
    first = agent(spec, repo, store)
    paused = await first.arun("Write the note.")
    assert paused.status == "awaiting_approval"
    first.approve(paused.run_id, by="ana")

    # A new agent, as a new process would build it from the same model spec.
    resumed = await agent(spec, repo, store).aresume(paused.run_id)
    assert (resumed.status, resumed.answer) == ("completed", ANSWER)
    assert (repo / "out.txt").read_text() == "hello\n"


async def test_a_restored_xml_script_answers_with_the_turn_after_the_snapshot(
    tmp_path: Path,
) -> None:
    spec = f"xml:script:{write_script(tmp_path, 'first', 'second')}"
    request = keel.ModelRequest("sys", (), (keel.UserMessage("q"),))
    before = resolve_model(spec)
    assert isinstance(before, Resumable)
    assert (await before.request(request)).text == "first"
    state = before.snapshot()

    after = resolve_model(spec)
    assert isinstance(after, Resumable)
    after.restore(state)
    assert (await after.request(request)).text == "second"


# --- what the wrapper claims ------------------------------------------------------------------


class Plain:
    """A text transport with no capabilities."""

    name = "plain"

    async def request(self, request: ModelRequest) -> ModelResponse:
        return ModelResponse("plain")


class Counter:
    def count(self, text: str) -> int:
        return len(text)


class FakeLocal(Plain):
    """A LocalModel without llama.cpp: counts characters, takes 3000 tokens."""

    name = "fake-local"

    @property
    def input_token_limit(self) -> int:
        return 3000

    def token_counter(self) -> TokenCounter:
        return Counter()


class FakeLocalScript(FakeLocal):
    """Both capabilities at once."""

    def snapshot(self) -> dict[str, Any]:
        return {"at": 3}

    def restore(self, state: dict[str, Any]) -> None:
        self.restored = state


INNER: dict[str, tuple[Any, bool, bool]] = {
    "plain": (Plain, False, False),
    "scripted": (lambda: ScriptedTransport.from_dict({"turns": []}), True, False),
    "local": (FakeLocal, False, True),
    "both": (FakeLocalScript, True, True),
}


@pytest.mark.parametrize("inner", list(INNER))
def test_the_wrapper_claims_a_capability_exactly_when_its_inner_transport_has_it(
    inner: str,
) -> None:
    make, resumable, local = INNER[inner]
    transport = XmlFallbackTransport(make())
    assert isinstance(transport, XmlFallbackTransport) and isinstance(transport, Transport)
    assert isinstance(transport, Resumable) is resumable
    assert isinstance(transport, LocalModel) is local


def test_the_declared_transports_satisfy_their_protocols() -> None:
    assert isinstance(ScriptedTransport.from_dict({"turns": []}), Resumable)
    local = LocalTransport(n_ctx=1024, max_tokens=24)  # loads nothing
    assert isinstance(local, LocalModel) and not isinstance(local, Resumable)
    assert local.input_token_limit == 1000


def test_both_capabilities_are_forwarded_together() -> None:
    inner = FakeLocalScript()
    transport = XmlFallbackTransport(inner)
    assert isinstance(transport, Resumable) and isinstance(transport, LocalModel)
    assert transport.snapshot() == {"at": 3}
    transport.restore({"at": 4})
    assert inner.restored == {"at": 4}
    assert transport.input_token_limit == 3000


def test_xml_over_a_local_model_lends_the_run_its_tokenizer_and_window() -> None:
    limits = keel.Limits(context_tokens=100_000)
    with keel.Agent(XmlFallbackTransport(FakeLocal()), limits=limits, store=":memory:") as agent:
        context = agent._setup(Opened("run_x", "q"), (), {}, ()).context
    assert isinstance(context.counter, Counter)
    assert context.budget == 3000 - keel.agent.WINDOW_MARGIN


def test_a_transport_without_a_local_model_keeps_the_estimate_and_the_budget() -> None:
    """Over a server the XML fallback lends its calibrated estimate (ADR 0035); the window is
    the one Keel assumes for a model it does not know (ADR 0056), the same for both."""
    limits = keel.Limits(context_tokens=100_000)
    with keel.Agent(Plain(), limits=limits, store=":memory:") as agent:
        plain = agent._setup(Opened("run_x", "q"), (), {}, ()).context
    with keel.Agent(XmlFallbackTransport(Plain()), limits=limits, store=":memory:") as agent:
        xml = agent._setup(Opened("run_x", "q"), (), {}, ()).context
    assert isinstance(plain.counter, EstimatingCounter)
    assert isinstance(xml.counter, CalibratedCounter)
    unknown = context_budget(100_000, UNKNOWN_WINDOW, keel.agent.WINDOW_MARGIN)
    assert plain.budget == xml.budget == unknown < 100_000
