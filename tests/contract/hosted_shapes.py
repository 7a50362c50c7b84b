"""Real response shapes of provider-hosted tools (ADR 0067), for the contract suite.

Anthropic: a Messages API answer that searched the web (``server_tool_use`` then
``web_search_tool_result`` with ``encrypted_content`` per result), fetched a page
(``web_fetch_tool_result`` holding a ``document``), hit its ``max_uses`` on a second search (a
``web_search_tool_result_error``), and answered in text blocks, one carrying a
``web_search_result_location`` citation, with ``usage.server_tool_use`` counting the requests;
and the same answer as the stream of server-sent events the API sends for it (the server block
whole in ``content_block_start``, the query as ``input_json_delta``, the citation as a
``citations_delta``). The field names and nesting are those of the SDK's own types
(``ServerToolUseBlock``, ``WebSearchToolResultBlock``, ``WebSearchResultBlock``,
``WebFetchToolResultBlock``, ``CitationsWebSearchResultLocation``, ``ServerToolUsage``).

OpenAI: a Responses API answer with a ``web_search_call`` item (``action`` of type ``search``
with its ``sources``, asked for with ``include``), a ``file_search_call`` and a message whose
``output_text`` carries ``url_citation`` annotations (the SDK's ``ResponseFunctionWebSearch``,
``ResponseFileSearchToolCall``, ``AnnotationURLCitation``); streamed, the API sends the whole
response again in ``response.completed``.
"""

from __future__ import annotations

import json
from typing import Any

from keel.hosted import Citation, HostedCall

RFC_URL = "https://www.rfc-editor.org/rfc/rfc9110.html"
MDN_URL = "https://developer.mozilla.org/en-US/docs/Web/HTTP/Reference/Status/503"
SEARCH_ID = "srvtoolu_01Kq7dW3hXbq2n5Jc8yVfT4e"
FETCH_ID = "srvtoolu_01Pf2Zr9mYcL6xA3wB7nD1sQ"
AGAIN_ID = "srvtoolu_01Ua4Gk8tRz5vE2hJ9qP3mWx"
ENCRYPTED = "EqoBCioIBxgCIiQ4ZjA1YjM3Ni1hYjEyLTQ0ZDEtOWQ1ZS05YjE0ZjhmMGE3ZjESDPc3kq0f"
INDEX = "EpABCioIBxgCIiQ4ZjA1YjM3Ni1hYjEyLTQ0ZDEtOWQ1ZS05YjE0ZjhmMGE3ZjESDA9x"
CITED = "The 503 (Service Unavailable) status code indicates that the server is currently unable"

SEARCH_USE = {
    "type": "server_tool_use",
    "id": SEARCH_ID,
    "name": "web_search",
    "input": {"query": "HTTP 503 Retry-After semantics"},
}
SEARCH_RESULT = {
    "type": "web_search_tool_result",
    "tool_use_id": SEARCH_ID,
    "content": [
        {
            "type": "web_search_result",
            "url": RFC_URL,
            "title": "RFC 9110: HTTP Semantics",
            "encrypted_content": ENCRYPTED,
            "page_age": "June 2022",
        },
        {
            "type": "web_search_result",
            "url": MDN_URL,
            "title": "503 Service Unavailable - HTTP | MDN",
            "encrypted_content": ENCRYPTED[::-1],
            "page_age": None,
        },
    ],
}
FETCH_USE = {
    "type": "server_tool_use",
    "id": FETCH_ID,
    "name": "web_fetch",
    "input": {"url": RFC_URL},
}
FETCH_RESULT = {
    "type": "web_fetch_tool_result",
    "tool_use_id": FETCH_ID,
    "content": {
        "type": "web_fetch_result",
        "url": RFC_URL,
        "retrieved_at": "2026-12-04T22:10:31.204Z",
        "content": {
            "type": "document",
            "source": {"type": "text", "media_type": "text/plain", "data": CITED + " to ..."},
            "title": "RFC 9110: HTTP Semantics",
            "citations": {"enabled": True},
        },
    },
}
AGAIN_USE = {
    "type": "server_tool_use",
    "id": AGAIN_ID,
    "name": "web_search",
    "input": {"query": "Retry-After header 503 RFC"},
}
AGAIN_RESULT = {
    "type": "web_search_tool_result",
    "tool_use_id": AGAIN_ID,
    "content": {"type": "web_search_tool_result_error", "error_code": "max_uses_exceeded"},
}
CITATION = {
    "type": "web_search_result_location",
    "url": RFC_URL,
    "title": "RFC 9110: HTTP Semantics",
    "encrypted_index": INDEX,
    "cited_text": CITED,
}
OPENING = "I'll look up what the RFC says."
CITED_TEXT = "A 503 means the server cannot handle the request for now"
CLOSING = ", and Retry-After says how long to wait."
ANSWER = OPENING + CITED_TEXT + CLOSING

ANTHROPIC_CONTENT = [
    {"type": "text", "text": OPENING},
    SEARCH_USE,
    SEARCH_RESULT,
    FETCH_USE,
    FETCH_RESULT,
    AGAIN_USE,
    AGAIN_RESULT,
    {"type": "text", "text": CITED_TEXT, "citations": [CITATION]},
    {"type": "text", "text": CLOSING},
]
"""The answer's content blocks, in the order the API sent them."""
ANTHROPIC_USAGE = {
    "input_tokens": 10_412,
    "cache_creation_input_tokens": 0,
    "cache_read_input_tokens": 0,
    "output_tokens": 236,
    "server_tool_use": {"web_search_requests": 1, "web_fetch_requests": 1},
    "service_tier": "standard",
}
ANTHROPIC_CALLS = (
    HostedCall(SEARCH_ID, "web_search", "HTTP 503 Retry-After semantics", (RFC_URL, MDN_URL)),
    HostedCall(FETCH_ID, "web_fetch", RFC_URL, (RFC_URL,)),
    HostedCall(AGAIN_ID, "web_search", "Retry-After header 503 RFC", (), "max_uses_exceeded"),
)
ANTHROPIC_CITATIONS = (Citation(RFC_URL, "RFC 9110: HTTP Semantics", CITED),)


def anthropic_message(content: list[dict[str, Any]], stop: str = "end_turn") -> dict[str, Any]:
    return {
        "id": "msg_01Hq3hV1c8t2PqDmW6sE9xZa",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-6",
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": ANTHROPIC_USAGE,
    }


def anthropic_stream() -> bytes:
    """`ANTHROPIC_CONTENT` as the API streams it."""
    start = {**anthropic_message([]), "stop_reason": None}
    start["usage"] = {"input_tokens": 10_412, "output_tokens": 3}
    events: list[dict[str, Any]] = [{"type": "message_start", "message": start}]
    for index, block in enumerate(ANTHROPIC_CONTENT):
        events += _block_events(index, block)
    events += [
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {
                "output_tokens": 236,
                "server_tool_use": {"web_search_requests": 1, "web_fetch_requests": 1},
            },
        },
        {"type": "message_stop"},
    ]
    return "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events).encode()


def _block_events(index: int, block: dict[str, Any]) -> list[dict[str, Any]]:
    if block["type"] == "server_tool_use":
        deltas = [{"type": "input_json_delta", "partial_json": json.dumps(block["input"])}]
        first: dict[str, Any] = {**block, "input": {}}
    elif block["type"] == "text":
        deltas = [{"type": "citations_delta", "citation": c} for c in block.get("citations", ())]
        deltas.append({"type": "text_delta", "text": block["text"]})
        first = {"type": "text", "text": ""}
    else:  # a result block comes whole
        deltas, first = [], block
    return [
        {"type": "content_block_start", "index": index, "content_block": first},
        *({"type": "content_block_delta", "index": index, "delta": d} for d in deltas),
        {"type": "content_block_stop", "index": index},
    ]


WS_ID = "ws_68af40a1b2c48193a9d0e1f2a3b4c5d605438e46b5f69a3b"
FS_ID = "fs_68af40a2c3d58193b0e1f2a3b4c5d6e705438e46b5f69a3b"
OPENAI_SEARCH = {
    "type": "web_search_call",
    "id": WS_ID,
    "status": "completed",
    "action": {
        "type": "search",
        "query": "HTTP 503 Retry-After semantics",
        "sources": [{"type": "url", "url": RFC_URL}, {"type": "url", "url": MDN_URL}],
    },
}
OPENAI_FILE_SEARCH = {
    "type": "file_search_call",
    "id": FS_ID,
    "status": "completed",
    "queries": ["retry policy", "backoff"],
    "results": None,
}
OPENAI_MESSAGE = {
    "type": "message",
    "id": "msg_68af40a4e5f78193d2f3a4b5c6d7e8f905438e46b5f69a3b",
    "status": "completed",
    "role": "assistant",
    "content": [
        {
            "type": "output_text",
            "text": ANSWER,
            "logprobs": [],
            "annotations": [
                {
                    "type": "url_citation",
                    "start_index": len(OPENING),
                    "end_index": len(OPENING) + len(CITED_TEXT),
                    "url": RFC_URL,
                    "title": "RFC 9110: HTTP Semantics",
                }
            ],
        }
    ],
}
OPENAI_OUTPUT = [OPENAI_SEARCH, OPENAI_FILE_SEARCH, OPENAI_MESSAGE]
OPENAI_CALLS = (
    HostedCall(WS_ID, "web_search", "HTTP 503 Retry-After semantics", (RFC_URL, MDN_URL)),
    HostedCall(FS_ID, "file_search", "retry policy\nbackoff", ()),
)
OPENAI_CITATIONS = (Citation(RFC_URL, "RFC 9110: HTTP Semantics"),)


def openai_stream(response: dict[str, Any]) -> bytes:
    """A Responses stream ending in ``response.completed`` with `response` whole."""
    events: list[dict[str, Any]] = [
        {"type": "response.created", "sequence_number": 0,
         "response": {**response, "status": "in_progress", "output": []}},
        {"type": "response.web_search_call.searching", "sequence_number": 1,
         "output_index": 0, "item_id": WS_ID},
        {"type": "response.output_text.delta", "sequence_number": 2, "output_index": 2,
         "item_id": OPENAI_MESSAGE["id"], "content_index": 0, "delta": ANSWER, "logprobs": []},
        {"type": "response.completed", "sequence_number": 3, "response": response},
    ]  # fmt: skip
    return "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events).encode()
