"""`web_search` over Exa, through its official client (`exa-py`): the request the client really
builds, read at an httpx transport under Keel's guarded client; the answer in Exa's own
shape; the key sent to ``api.exa.ai`` only (ADR 0067, the backend ADR 0061 left for later)."""

from __future__ import annotations

import json

import pytest

from keel.errors import ConfigError
from keel.tools.search_backends import ExaBackend, backend_from_spec
from keel.tools.web_search import SearchError, search_tools
from recording_transport import Recorder

EXA_ANSWER = {  # the shape of Exa's POST /search answer with highlights (its API reference)
    "requestId": "b5947044c4b78efa9552a7c89b306d95",
    "resolvedSearchType": "neural",
    "searchType": "auto",
    "results": [
        {
            "id": "https://www.rfc-editor.org/rfc/rfc9110.html",
            "url": "https://www.rfc-editor.org/rfc/rfc9110.html",
            "title": "RFC 9110: HTTP Semantics",
            "publishedDate": "2022-06-01T00:00:00.000Z",
            "author": "R. Fielding, M. Nottingham, J. Reschke",
            "highlights": [
                "The server MAY send a Retry-After header field to suggest an appropriate "
                "amount of time for the client to wait before retrying the request.",
            ],
            "highlightScores": [0.61],
        },
        {
            "id": "https://developer.mozilla.org/en-US/docs/Web/HTTP/Headers/Retry-After",
            "url": "https://developer.mozilla.org/en-US/docs/Web/HTTP/Headers/Retry-After",
            "title": "Retry-After - HTTP | MDN",
            "publishedDate": None,
            "author": None,
            "highlights": ["The Retry-After response <b>HTTP</b> header indicates", "how long"],
            "highlightScores": [0.48, 0.31],
        },
    ],
    "costDollars": {"total": 0.005, "search": {"neural": 0.005}},
}


async def test_exa_sends_its_key_only_to_its_own_host_and_its_hits_are_read() -> None:
    recorder = Recorder(200, json=EXA_ANSWER)
    backend = ExaBackend(env={"EXA_API_KEY": "exa-test-0123456789"}, transport=recorder.transport())
    [tool] = search_tools(backend)
    text = str(await tool.fn(query="when to retry after a 503", max_results=4))
    [request] = recorder.requests
    assert request.method == "POST"
    assert str(request.url) == "https://api.exa.ai/search"
    assert request.headers["x-api-key"] == "exa-test-0123456789"
    sent = json.loads(request.content)
    assert sent["query"] == "when to retry after a 503"
    assert sent["numResults"] == 4
    assert sent["contents"] == {"highlights": True}
    assert text.startswith("Search results (exa), 2 hits.")
    assert "1. RFC 9110: HTTP Semantics" in text
    assert "URL: https://developer.mozilla.org/en-US/docs/Web/HTTP/Headers/Retry-After" in text
    assert "suggest an appropriate amount of time" in text
    assert "<b>" not in text  # a hit's markup is the page's, removed like any


async def test_an_exa_redirect_is_not_followed_and_the_key_stays() -> None:
    recorder = Recorder(307, headers={"Location": "https://collector.example.net/search"})
    backend = ExaBackend(env={"EXA_API_KEY": "exa-secret-key-0000"}, transport=recorder.transport())
    with pytest.raises(SearchError) as caught:
        await backend.search("anything", 5)
    assert [str(r.url) for r in recorder.requests] == ["https://api.exa.ai/search"]
    assert "exa-secret-key-0000" not in str(caught.value)


async def test_an_exa_error_is_a_message_for_the_model_without_the_key() -> None:
    echoed = {"error": "Invalid API key exa-wrong-key-1111", "requestId": "c0ffee"}
    refused = Recorder(401, json=echoed)
    backend = ExaBackend(env={"EXA_API_KEY": "exa-wrong-key-1111"}, transport=refused.transport())
    with pytest.raises(SearchError, match="Exa's search failed") as caught:
        await backend.search("anything", 5)
    assert "exa-wrong-key-1111" not in str(caught.value) and "[key]" in str(caught.value)


def test_exa_needs_its_key_and_takes_no_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EXA_API_KEY", raising=False)
    with pytest.raises(ConfigError, match="EXA_API_KEY"):
        backend_from_spec("exa")
    monkeypatch.setenv("EXA_API_KEY", "exa-x-0123456789")
    with pytest.raises(ConfigError, match="takes no address"):
        backend_from_spec("exa:https://collector.example.net")
    assert backend_from_spec("exa").name == "exa"
