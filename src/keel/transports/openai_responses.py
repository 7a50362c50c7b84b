"""The OpenAI Responses API (``POST /v1/responses``) as a Keel transport.

Wire mapping, both ways, in pure functions (`to_wire`, `from_wire`); `request` is a thin shell
around one SDK call. The choices that are not obvious from the API reference:

- ``store: false`` on every request. Keel keeps its own history and replays it in full, so a
  run never depends on server-side state (``previous_response_id``), and a resumed run on
  another machine sends exactly what the first would have.
- Because nothing is stored, item ids (``msg_...``, ``fc_...``, ``rs_...``) cannot be resolved
  by the server and are not sent back: assistant text replays as an assistant-role message,
  calls as ``function_call`` items keyed by ``call_id`` (the provider's, unless it repeated one:
  `messages.wire_call_ids`). Reasoning items are the exception:
  they replay whole, but only when they carry ``encrypted_content`` (a bare ``rs_`` id fails
  with "Items are not persisted when store is set to false"). The API returns that content by
  default (SDK 3.57 documents it so); ``include: ["reasoning.encrypted_content"]`` is not sent,
  because models without reasoning reject it with a 400.
- Function tools are sent with ``strict: false``: the Responses API defaults to strict mode,
  which would reject ordinary schemas (optional properties, no ``additionalProperties``).
- ``tool_choice`` is left out unless the request says "none" (ADR 0002: None keeps the
  provider's default) or "required" (ADR 0027); with no tools at all neither ``tools`` nor
  ``tool_choice`` is sent.
- Volatile controls are appended last, one user-role message each, after the history.
- ``prompt_cache_key`` is the run's key (`ModelRequest.cache_key`): OpenAI caches prompt
  prefixes on its own and routes requests with the same key to the same cache, so every turn of
  a run finds the prefix the previous turn left (ADR 0021).
- Error tool results have no wire flag; their text is marked (see `_openai_common`).

Round-trip data: `from_wire` puts the response's output layout in
``provider_details["openai_responses"] = {"output": [...]}``, in output order, where each entry
is a reasoning item exactly as returned, ``{"type": "message", "phase": ...}`` marking where the
text stood (and its phase, which newer models want back, and its ``url_citation``
annotations, the answer's sources), ``{"type": "function_call", "call_id": ...}`` marking a
call, or a hosted tool's call item as returned (ADR 0067). Hosted calls are not sent back:
with ``store: false`` their ``ws_``/``fs_`` ids name nothing the server kept, and the item
holds no results, only what was asked; the text that used them is sent back as any text.
`to_wire` replays an assistant turn in that order, taking the
text and the calls from the AssistantMessage itself, so Keel's own fields stay authoritative.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from typing import Annotated, Any

import httpx
import httpx2
import openai
from pydantic import Discriminator, Tag

from keel.errors import ConfigError, ProviderError
from keel.hosted import HostedTool, check_kinds
from keel.messages import (
    AssistantMessage,
    Item,
    ModelRequest,
    ModelResponse,
    ToolCall,
    ToolDefinition,
    Usage,
    wire_call_ids,
)
from keel.transports._openai_common import (
    PROVIDER,
    build_client,
    json_schema_format,
    post,
    post_streaming,
    server_address,
    tool_output_text,
)
from keel.transports.base import ServerToolChoice
from keel.transports.bounded import DEFAULT_MAX_RESPONSE_BYTES
from keel.transports.keys import sent_key
from keel.transports.sse_readers import read_responses
from keel.transports.streaming import OnText
from keel.transports.wire import Opaque, Shape, TokenCount, parse

__all__ = ["PROVIDER_KEY", "OpenAIResponsesTransport", "from_wire", "to_wire", "usage"]

PROVIDER_KEY = "openai_responses"
"""The `provider_details` key this transport reads and writes; see the module docstring."""

_RETRYABLE_FAILURES = frozenset({"server_error", "rate_limit_exceeded"})
"""Codes of a response that came back with ``status: "failed"`` that a retry may fix."""


class OpenAIResponsesTransport:
    """Speaks the Responses API through the ``openai`` SDK; one attempt per call."""

    streams = True
    """It streams its answer's text to a listener (`request_streaming`, ADR 0039)."""

    def __init__(
        self,
        model: str,
        *,
        client: openai.AsyncOpenAI | None = None,
        http_client: httpx.AsyncClient | httpx2.AsyncClient | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        max_output_tokens: int | None = None,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        tool_choice: ServerToolChoice | None = None,
        hosted_tools: Iterable[HostedTool] = (),
    ) -> None:
        """`client` or (`http_client`, `base_url`, `api_key`) build the SDK client, with the
        SDK's own retries off. The key: `api_key`, else OPENAI_API_KEY for OpenAI itself; a
        server the user chose gets a placeholder unless given a key (`keel.transports.keys`).
        `max_response_bytes` bounds every answer, decompressed (`keel.transports.bounded`).
        `tool_choice`: sent on turns with tools that ask for nothing themselves.
        `hosted_tools`: OpenAI's own tools declared with every request (ADR 0067)."""
        self.name = f"openai:{model}"
        self.model = model
        self.max_output_tokens = max_output_tokens
        self.tool_choice = tool_choice
        self.hosted_tools = check_kinds(hosted_tools, "openai")
        for tool in self.hosted_tools:
            if tool.max_uses is not None:
                raise ConfigError(
                    f"hosted tool {tool.kind}: max_uses is Anthropic's; the Responses API "
                    "takes no cap per tool (--max-tool-calls counts its calls)"
                )
        self._client = build_client(
            client=client,
            http_client=http_client,
            base_url=base_url,
            api_key=api_key,
            max_response_bytes=max_response_bytes,
        )

    @property
    def server_address(self) -> tuple[str, int]:
        return server_address(self._client)

    def secret(self) -> str | None:
        """The API key sent, scrubbed from answers (`keel.transports.base.Keyed`)."""
        return sent_key(self._client.api_key)

    def _body(self, request: ModelRequest) -> dict[str, Any]:
        """The request's body, the same streamed or not (but for the stream flag)."""
        return to_wire(
            request,
            model=self.model,
            max_output_tokens=self.max_output_tokens,
            tool_choice=self.tool_choice,
            hosted=self.hosted_tools,
        )

    async def request(self, request: ModelRequest) -> ModelResponse:
        create = self._client.responses.with_raw_response.create
        return await post(self._client, create, self._body(request), from_wire)

    async def request_streaming(self, request: ModelRequest, on_text: OnText) -> ModelResponse:
        """`request` with ``"stream": true``: text to `on_text` as it comes (ADR 0039)."""
        body = self._body(request)
        body["stream"] = True
        create = self._client.responses.with_streaming_response.create
        return await post_streaming(self._client, create, body, read_responses, on_text, from_wire)


# --- to the wire ------------------------------------------------------------------------------


def to_wire(
    request: ModelRequest,
    *,
    model: str,
    max_output_tokens: int | None = None,
    tool_choice: ServerToolChoice | None = None,
    hosted: Iterable[HostedTool] = (),
) -> dict[str, Any]:
    """The JSON body for ``POST /v1/responses``. The frozen prefix (instructions, tools) comes
    first and is built the same way every turn, so it serialises byte-identically.
    `tool_choice` is sent when the request asks for none itself; `hosted`: OpenAI's own tools
    the user declared, after Keel's (ADR 0067)."""
    body: dict[str, Any] = {"model": model}
    if request.system:
        body["instructions"] = request.system
    tools = [*(_tool(tool) for tool in request.tools), *(_hosted(tool) for tool in hosted)]
    if tools:
        body["tools"] = tools
        choice = request.tool_choice or tool_choice
        if choice is not None:
            body["tool_choice"] = choice
    if any(tool.kind == "web_search" for tool in hosted):  # the pages each search found
        body["include"] = ["web_search_call.action.sources"]
    body["input"] = [*_input(request.items), *(_user(text) for text in request.volatile)]
    body["store"] = False
    if request.cache_key:
        body["prompt_cache_key"] = request.cache_key
    if max_output_tokens is not None:
        body["max_output_tokens"] = max_output_tokens
    if request.output is not None:  # structured output, natively (keel/structured.py)
        body["text"] = {"format": json_schema_format(request.output)}
    return body


def _tool(tool: ToolDefinition) -> dict[str, Any]:
    return {
        "type": "function",
        "name": tool.name,
        "description": tool.description,
        "parameters": tool.parameters,
        "strict": False,
    }


def _hosted(tool: HostedTool) -> dict[str, Any]:
    """A hosted tool's declaration (the SDK's ``WebSearchToolParam``, ``FileSearchToolParam``)."""
    if tool.kind == "file_search":
        return {"type": "file_search", "vector_store_ids": list(tool.stores)}
    declared: dict[str, Any] = {"type": "web_search"}
    if tool.domains:
        declared["filters"] = {"allowed_domains": list(tool.domains)}
    return declared


def _user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text}


def _input(items: Iterable[Item]) -> list[dict[str, Any]]:
    items = tuple(items)
    ids = wire_call_ids(items)
    out: list[dict[str, Any]] = []
    for item in items:
        if item.kind == "user":
            out.append(_user(item.text))
        elif item.kind == "assistant":
            out.extend(_assistant(item, ids))
        else:
            out.append(
                {
                    "type": "function_call_output",
                    "call_id": ids.get(item.call_id, item.call_id),
                    "output": tool_output_text(item),
                }
            )
    return out


def _assistant(message: AssistantMessage, ids: Mapping[str, str]) -> list[dict[str, Any]]:
    """One assistant turn as input items, in the order the model produced them. The layout
    names calls by the provider's ids, which a provider may repeat: each entry takes the next
    call not yet placed that has its id, so every call goes out once."""
    details = message.provider_details.get(PROVIDER_KEY)
    layout: list[Any] = details.get("output", []) if isinstance(details, Mapping) else []
    unplaced: dict[str, deque[ToolCall]] = {}
    for call in message.tool_calls:
        unplaced.setdefault(call.provider_call_id, deque()).append(call)
    placed: set[str] = set()
    out: list[dict[str, Any]] = []
    text_sent = False
    for entry in layout:
        kind = entry.get("type") if isinstance(entry, Mapping) else None
        if kind == "reasoning" and entry.get("encrypted_content"):
            out.append(dict(entry))
        elif kind == "message" and not text_sent and message.text:
            out.append(_assistant_text(message.text, entry.get("phase")))
            text_sent = True
        elif kind == "function_call" and (queue := unplaced.get(entry.get("call_id"))):
            call = queue.popleft()
            placed.add(call.id)
            out.append(_function_call(call, ids[call.id]))
    if message.text and not text_sent:
        out.insert(0, _assistant_text(message.text, None))
    out.extend(_function_call(c, ids[c.id]) for c in message.tool_calls if c.id not in placed)
    return out


def _assistant_text(text: str, phase: Any) -> dict[str, Any]:
    item: dict[str, Any] = {"type": "message", "role": "assistant", "content": text}
    if phase:
        item["phase"] = phase
    return item


def _function_call(call: ToolCall, wire_id: str) -> dict[str, Any]:
    return {
        "type": "function_call",
        "call_id": wire_id,
        "name": call.name,
        "arguments": call.raw_arguments,
    }


# --- from the wire ----------------------------------------------------------------------------


def from_wire(data: Mapping[str, Any]) -> ModelResponse:
    """A Responses API ``response`` object as a ModelResponse.

    The body is read as `_Response` first, so a field of the wrong type is a ProviderError
    naming it (`keel.transports.wire`). Text is every ``output_text`` part of every message,
    concatenated (a refusal stands in when there is no text, so it reaches the user instead of
    looking like an empty turn). Hosted-tool calls (``web_search_call``, ``file_search_call``)
    are kept whole in the layout, where `keel.hosted` reads them; other items are ignored.
    """
    response = parse(_Response, data, PROVIDER)
    if response.status == "failed":
        raise _failed(response.error or _Error())
    texts: list[str] = []
    refusals: list[str] = []
    calls: list[ToolCall] = []
    layout: list[dict[str, Any]] = []
    for item in response.output or ():
        if isinstance(item, _MessageItem):
            cited: list[dict[str, Any]] = []
            for part in item.content or ():
                if isinstance(part, _OutputText):
                    texts.append(part.text or "")
                    cited.extend(dict(a.raw) for a in part.annotations or ())
                elif isinstance(part, _Refusal):
                    refusals.append(part.refusal or "")
            entry: dict[str, Any] = {"type": "message", "phase": item.phase}
            if cited:  # the answer's sources (url_citation), kept with it
                entry["annotations"] = cited
            layout.append(entry)
        elif isinstance(item, _CallItem):
            call = ToolCall.from_raw(
                item.call_id or item.id or "", item.name or "", item.arguments or ""
            )
            calls.append(call)
            layout.append({"type": "function_call", "call_id": call.id})
        elif isinstance(item, Opaque):  # reasoning, replayed whole; a hosted call, recorded
            layout.append(dict(item.raw))
    text = "".join(texts) or "".join(refusals) or None
    incomplete = response.incomplete_details
    stop = incomplete.reason if incomplete and response.status == "incomplete" else None
    return ModelResponse(
        text=text,
        tool_calls=tuple(calls),
        usage=_usage(response.usage),
        stop_reason=stop or response.status,
        provider_details={PROVIDER_KEY: {"output": layout}} if layout else {},
        response_id=response.id,
        model=response.model,
    )


def usage(data: Mapping[str, Any] | None) -> Usage:
    """Responses usage; absent fields count as zero."""
    return _usage(parse(_Usage, data or {}, PROVIDER, "usage"))


def _usage(usage: _Usage | None) -> Usage:
    if usage is None:
        return Usage()
    details = usage.input_tokens_details
    return Usage(
        input_tokens=usage.input_tokens or 0,
        output_tokens=usage.output_tokens or 0,
        cached_input_tokens=(details.cached_tokens if details else None) or 0,
    )


def _failed(error: _Error) -> ProviderError:
    """A 200 whose response says ``status: "failed"``: an error like any other."""
    message = error.message or "the response failed without a message"
    return ProviderError(
        f"{PROVIDER}: response failed ({error.code}): {message}",
        retryable=error.code in _RETRYABLE_FAILURES,
    )


# --- the shape of an answer (what is read, and no more) ---------------------------------------


def _by_type(*known: str) -> Discriminator:
    """Items and parts are told apart by ``type``; a type Keel does not read is `_Other`."""

    def tag(value: Any) -> str:
        kind = value.get("type") if isinstance(value, Mapping) else None
        return f"~{kind}" if kind in known else "~other"

    return Discriminator(tag)


class _Other(Shape):
    """An item or part of a type Keel does not read: only checked to be an object."""


class _OutputText(Shape):
    text: str | None = None
    annotations: list[Opaque] | None = None


class _Refusal(Shape):
    refusal: str | None = None


_Part = Annotated[
    Annotated[_OutputText, Tag("~output_text")]
    | Annotated[_Refusal, Tag("~refusal")]
    | Annotated[_Other, Tag("~other")],
    _by_type("output_text", "refusal"),
]


class _MessageItem(Shape):
    content: list[_Part] | None = None
    phase: str | None = None


class _CallItem(Shape):
    call_id: str | None = None
    id: str | None = None
    name: str | None = None
    arguments: str | None = None


_Item = Annotated[
    Annotated[_MessageItem, Tag("~message")]
    | Annotated[_CallItem, Tag("~function_call")]
    | Annotated[Opaque, Tag("~reasoning")]
    | Annotated[Opaque, Tag("~web_search_call")]
    | Annotated[Opaque, Tag("~file_search_call")]
    | Annotated[_Other, Tag("~other")],
    _by_type("message", "function_call", "reasoning", "web_search_call", "file_search_call"),
]


class _InputDetails(Shape):
    cached_tokens: TokenCount | None = None


class _Usage(Shape):
    input_tokens: TokenCount | None = None
    output_tokens: TokenCount | None = None
    input_tokens_details: _InputDetails | None = None


class _Incomplete(Shape):
    reason: str | None = None


class _Error(Shape):
    code: str | None = None
    message: str | None = None


class _Response(Shape):
    id: str | None = None
    model: str | None = None
    status: str | None = None
    output: list[_Item] | None = None
    usage: _Usage | None = None
    incomplete_details: _Incomplete | None = None
    error: _Error | None = None
