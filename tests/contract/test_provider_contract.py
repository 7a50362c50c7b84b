"""The shared provider contract (ADR 0013, "Model gateway"): every transport, ordinary and
synthesis requests, payloads sent, responses parsed, usage normalised, errors classified."""

from __future__ import annotations

import importlib
import json
import pkgutil
from pathlib import Path

import httpx
import pytest

from keel.errors import ProviderError
from keel.messages import ModelResponse

from .harness import (
    TOOLS,
    ContractCase,
    Recorder,
    ordinary_request,
    required_request,
    synthesis_request,
)


def _cases() -> list[ContractCase]:
    found = []
    for module in pkgutil.iter_modules([str(Path(__file__).parent)]):
        if module.name.startswith("case_"):
            found.append(importlib.import_module(f"{__package__}.{module.name}").CASE)
    return sorted(found, key=lambda case: case.name)


CASES = _cases()


def ids(case: ContractCase) -> str:
    return case.name


async def send(
    case: ContractCase, responses: list[httpx.Response], synthesis: bool = False
) -> tuple[ModelResponse, Recorder]:
    captured = Recorder(*responses)
    transport = case.make(captured.http())
    request = synthesis_request() if synthesis else ordinary_request()
    return await transport.request(request), captured


@pytest.mark.parametrize("case", CASES, ids=ids)
async def test_ordinary_request_sends_tools_and_no_tool_choice(case: ContractCase) -> None:
    _, captured = await send(case, [case.text_response()])
    assert len(captured.sent) == 1
    case.check_ordinary(captured.body())


@pytest.mark.parametrize("case", CASES, ids=ids)
async def test_synthesis_request_sends_none_tool_choice_and_control_last(
    case: ContractCase,
) -> None:
    _, captured = await send(case, [case.text_response()], synthesis=True)
    assert len(captured.sent) == 1
    case.check_synthesis(captured.body())


@pytest.mark.parametrize("case", CASES, ids=ids)
async def test_a_required_tool_choice_is_sent_as_the_providers_any(case: ContractCase) -> None:
    captured = Recorder(case.text_response())
    await case.make(captured.http()).request(required_request())
    body = captured.body()
    assert body.get("tool_choice") == case.required_choice
    names = {t.name for t in TOOLS}
    wire = json.dumps(body)
    assert all(name in wire for name in names)  # the tools go with it, natively or in words


@pytest.mark.parametrize("case", CASES, ids=ids)
@pytest.mark.parametrize("synthesis", [False, True], ids=["ordinary", "synthesis"])
async def test_text_response_is_parsed_with_normalised_usage(
    case: ContractCase, synthesis: bool
) -> None:
    response, _ = await send(case, [case.text_response()], synthesis=synthesis)
    assert response.text == "The loop depends on the breaker."
    assert response.tool_calls == ()
    assert (response.usage.input_tokens, response.usage.output_tokens) == (120, 9)
    assert response.usage.cached_input_tokens == 20


@pytest.mark.parametrize("case", CASES, ids=ids)
async def test_several_tool_calls_are_parsed(case: ContractCase) -> None:
    response, _ = await send(case, [case.tool_calls_response()])
    calls = response.tool_calls
    assert [c.name for c in calls] == ["fetch", "read_file"]
    assert [c.arguments for c in calls] == [{"url": "https://example.org/a"}, {"path": "README.md"}]
    assert [c.key for c in calls] == [
        'fetch {"url":"https://example.org/a"}',
        'read_file {"path":"README.md"}',
    ]
    assert len({c.id for c in calls}) == 2
    assert response.usage.input_tokens > 0


@pytest.mark.parametrize("case", CASES, ids=ids)
@pytest.mark.parametrize(
    ("status", "retryable"),
    [(429, True), (500, True), (503, True), (400, False), (401, False), (403, False), (404, False)],
)
async def test_errors_are_classified_with_the_provider_message(
    case: ContractCase, status: int, retryable: bool
) -> None:
    with pytest.raises(ProviderError) as info:
        await send(case, [case.error_response(status)])
    error = info.value
    assert error.status == status
    assert error.retryable is retryable
    assert f"simulated failure {status}" in error.message
    if status == 429:
        assert error.retry_after == 7


@pytest.mark.parametrize("case", CASES, ids=ids)
@pytest.mark.parametrize("failure", [httpx.ConnectError, httpx.ReadTimeout])
async def test_dropped_connections_and_timeouts_are_retryable(
    case: ContractCase, failure: type[httpx.TransportError]
) -> None:
    def broken(request: httpx.Request) -> httpx.Response:
        raise failure("simulated network failure", request=request)

    transport = case.make(httpx.AsyncClient(transport=httpx.MockTransport(broken)))
    with pytest.raises(ProviderError) as info:
        await transport.request(ordinary_request())
    assert info.value.retryable
