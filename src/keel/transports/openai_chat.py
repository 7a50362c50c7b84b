"""OpenAI Chat Completions (``POST /v1/chat/completions``) as a Keel transport.

The same wire protocol is spoken by many servers besides OpenAI's (llama.cpp, vLLM, Ollama,
hosted gateways), so the mapping asks little of the server and forgives a lot in its answers:

- A request without tools sends neither ``tools`` nor ``tool_choice``: the XML fallback sends
  tool-less requests through this transport, and servers reject ``tool_choice`` without tools.
- ``tool_choice`` is otherwise left out unless the request says "none" (ADR 0002) or
  "required" (a run insisting on evidence first, ADR 0027), or the transport was given one to
  send on every other turn (`tool_choice`, ``--tool-choice``): llama-cpp-python's
  ``chatml-function-calling`` ignores the tools unless it is sent (ADR 0035).
- The system prompt is the first message; volatile controls are appended last, one user message
  each, after the history.
- Assistant turns replay with ``content`` (``""`` when the turn had no text: the official API
  accepts both, llama-cpp-python's server answers 500 to null, ADR 0035) and ``tool_calls``;
  results replay as ``tool`` messages paired by ``tool_call_id``: the provider's call ids, except
  where a provider repeated one (then Keel's, `messages.wire_call_ids`), so no two calls of a
  request share an id. Error results have no wire flag, so their text is marked (see
  `_openai_common.ERROR_MARKER`).
- The output limit goes out as ``max_completion_tokens`` to OpenAI (its newer models refuse
  ``max_tokens``) and as ``max_tokens`` to any other server, which all understand that one.
- ``prompt_cache_key`` (the run's key, `ModelRequest.cache_key`) goes to OpenAI only, so that
  each turn of a run meets the prefix the previous one cached; other servers may refuse fields
  they do not know, and cache by prefix anyway (llama.cpp, vLLM).
- Every request to a server other than OpenAI's own API is streamed (``stream="always"``, the
  default there), watched or not: llama-cpp-python's server stops generating only when the
  client of a streamed request goes away, so a request Keel's timeout gives up no longer keeps
  that server busy for the next one (ADR 0065). OpenAI itself is streamed only when someone
  watches the text (``"when-watched"``, the default there; either can be chosen). A stream
  that ends without usage (that server ignores ``stream_options``) is counted by Keel's own
  counter and its usage marked estimated (`keel.tokens.estimated_usage`), so the budgets go on
  counting. A server that answers a streamed request with a whole JSON completion is read as
  one; a stream that ends before its first event is asked again whole (the server's own error
  then classifies it), and a kind of request answered only whole goes whole from then on.
- In answers: missing ``usage`` or ``prompt_tokens_details`` count as zero, a missing call id is
  made up, arguments sent as an object instead of a string are re-encoded, and content sent as a
  list of text parts is joined. Beyond that forgiveness, the answer is read against its declared
  shape (`_Completion`): a field of the wrong type fails the attempt, naming the field.
- An answer that is a tool call written as text (a chat template's pseudo-call, which servers
  such as llama-cpp-python's pass through: `keel.transports.text_calls`) is read as that call
  when it names a tool of the request; one that cannot be read, or any in a turn that allows
  no calls, fails the attempt (not retried) naming the chat format and what to use instead.
  It is never taken for the answer. Requests without tools (the XML fallback's) are left alone.

`to_wire` and `from_wire` are pure; `request` is a thin shell around one SDK call.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

import httpx
import httpx2
import openai
from pydantic import JsonValue

from keel.messages import Item, ModelRequest, ModelResponse, ToolCall, Usage, wire_call_ids
from keel.tokens import CalibratedCounter, TokenCounter, estimated_usage
from keel.transports._openai_common import (
    OPENAI_HOST,
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
from keel.transports.sse_readers import read_chat
from keel.transports.streaming import OnText
from keel.transports.text_calls import calls_in_text
from keel.transports.wire import Shape, TokenCount, parse

__all__ = [
    "OPENAI_HOST",
    "OpenAIChatTransport",
    "StreamWhen",
    "calls_in_text",
    "from_wire",
    "to_wire",
    "usage",
]

StreamWhen = Literal["always", "when-watched"]
"""When a request goes out streamed: every time, or only when someone watches its text."""


class OpenAIChatTransport:
    """Speaks Chat Completions through the ``openai`` SDK; one attempt per call."""

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
        max_tokens: int | None = None,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        tool_choice: ServerToolChoice | None = None,
        stream: StreamWhen | None = None,
        counter: TokenCounter | None = None,
    ) -> None:
        """`client` or (`http_client`, `base_url`, `api_key`) build the SDK client, with the
        SDK's own retries off. The key: `api_key`, else OPENAI_API_KEY for OpenAI itself; a
        server the user chose gets a placeholder unless given a key (`keel.transports.keys`).
        `max_response_bytes` bounds every answer, decompressed (`keel.transports.bounded`).
        `tool_choice`: sent on turns with tools that ask for nothing themselves. `stream`:
        "always" or "when-watched"; None: "when-watched" for OpenAI's own API, "always" for
        any other server (see the module docstring). `counter` counts the tokens of a stream
        that reports none (default: `keel.tokens.CalibratedCounter`)."""
        self.name = f"openai-chat:{model}"
        self.model = model
        self.max_tokens = max_tokens
        self.tool_choice = tool_choice
        self._client = build_client(
            client=client,
            http_client=http_client,
            base_url=base_url,
            api_key=api_key,
            max_response_bytes=max_response_bytes,
        )
        self._at_openai = self._client.base_url.host == OPENAI_HOST
        self._limit_field = "max_completion_tokens" if self._at_openai else "max_tokens"
        if stream not in (None, "always", "when-watched"):
            raise ValueError(f"stream must be 'always' or 'when-watched', not {stream!r}")
        self.stream: StreamWhen = stream or ("when-watched" if self._at_openai else "always")
        self._counter = counter or CalibratedCounter()
        self._goes_whole: set[bool] = set()
        """The kinds of request (`_may_call`) this server answered whole after a stream of
        nothing: asked whole from then on, not streamed for nothing first each time."""

    @property
    def server_address(self) -> tuple[str, int]:
        return server_address(self._client)

    def secret(self) -> str | None:
        """The API key sent, scrubbed from answers (`keel.transports.base.Keyed`)."""
        return sent_key(self._client.api_key)

    def _body(self, request: ModelRequest) -> dict[str, Any]:
        """The request's body, the same streamed or not (but for the stream flags)."""
        return to_wire(
            request,
            model=self.model,
            max_tokens=self.max_tokens,
            limit_field=self._limit_field,
            send_cache_key=self._at_openai,
            tool_choice=self.tool_choice,
        )

    async def request(self, request: ModelRequest) -> ModelResponse:
        if self.stream == "always":
            return await self.request_streaming(request, _unheard)
        return calls_in_text(await self._whole(request, from_wire), request)

    async def _whole(
        self,
        request: ModelRequest,
        read: Callable[[dict[str, Any]], ModelResponse],
        *,
        after_stream: bool = False,
    ) -> ModelResponse:
        create = self._client.chat.completions.with_raw_response.create
        body = self._body(request)
        return await post(self._client, create, body, read, again_if_closed=after_stream)

    async def request_streaming(self, request: ModelRequest, on_text: OnText) -> ModelResponse:
        """`request` with ``"stream": true`` (and the usage asked for in the last chunk, which
        a streamed completion otherwise leaves out): text to `on_text` as it comes (ADR 0039).
        An answer without usage is counted here, marked estimated. A stream that ends before
        its first event is asked again whole, to hear the server's own error; when the whole
        request is answered, requests of its kind go whole on this server (ADR 0065)."""
        body = self._body(request)
        body["stream"], body["stream_options"] = True, {"include_usage": True}
        create = self._client.chat.completions.with_streaming_response.create

        def read(data: dict[str, Any]) -> ModelResponse:
            response = from_wire(data)
            if data.get("usage") is not None:
                return response
            counted = estimated_usage(self._counter, request, response)
            return dataclasses.replace(response, usage=counted)

        kind = _may_call(body)
        if kind in self._goes_whole:
            return calls_in_text(await self._whole(request, read), request)

        async def whole() -> ModelResponse:
            answered = await self._whole(request, read, after_stream=True)
            self._goes_whole.add(kind)  # not an error of this request: this server's way
            return answered

        response = await post_streaming(
            self._client, create, body, read_chat, on_text, read, whole=whole
        )
        return calls_in_text(response, request)


def _may_call(body: Mapping[str, Any]) -> bool:
    """Whether a request may be answered with a call: it sends tools and lets the model choose
    or asks for one. llama-cpp-python's ``chatml-function-calling`` cannot stream those
    ("Automatic streaming tool choice is not supported": a 200, then nothing)."""
    return bool(body.get("tools")) and body.get("tool_choice", "none") != "none"


def _unheard(text: str) -> None:
    """Nobody listens: a request streamed only so that giving it up stops the server."""


# --- to the wire ------------------------------------------------------------------------------


def to_wire(
    request: ModelRequest,
    *,
    model: str,
    max_tokens: int | None = None,
    limit_field: str = "max_tokens",
    send_cache_key: bool = False,
    tool_choice: ServerToolChoice | None = None,
) -> dict[str, Any]:
    """The JSON body for ``POST /v1/chat/completions``; `send_cache_key` adds the request's
    ``prompt_cache_key`` (OpenAI's own servers only, see the module docstring); `tool_choice`
    is sent when the request asks for none itself."""
    messages: list[dict[str, Any]] = []
    if request.system:
        messages.append({"role": "system", "content": request.system})
    messages.extend(_messages(request.items))
    messages.extend({"role": "user", "content": text} for text in request.volatile)
    body: dict[str, Any] = {"model": model, "messages": messages}
    if request.tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": tool.name,
                    "description": tool.description,
                    "parameters": tool.parameters,
                },
            }
            for tool in request.tools
        ]
        choice = request.tool_choice or tool_choice
        if choice is not None:
            body["tool_choice"] = choice
    if max_tokens is not None:
        body[limit_field] = max_tokens
    if send_cache_key and request.cache_key:
        body["prompt_cache_key"] = request.cache_key
    if request.output is not None:  # structured output, natively (keel/structured.py)
        schema = json_schema_format(request.output)
        del schema["type"]
        body["response_format"] = {"type": "json_schema", "json_schema": schema}
    return body


def _messages(items: Iterable[Item]) -> list[dict[str, Any]]:
    items = tuple(items)
    ids = wire_call_ids(items)
    out: list[dict[str, Any]] = []
    for item in items:
        if item.kind == "user":
            out.append({"role": "user", "content": item.text})
        elif item.kind == "assistant":
            # "" rather than null without text: every compatible server accepts a string
            message: dict[str, Any] = {"role": "assistant", "content": item.text or ""}
            if item.tool_calls:
                message["tool_calls"] = [
                    {
                        "id": ids[call.id],
                        "type": "function",
                        "function": {"name": call.name, "arguments": call.raw_arguments},
                    }
                    for call in item.tool_calls
                ]
            out.append(message)
        else:
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": ids.get(item.call_id, item.call_id),
                    "content": tool_output_text(item),
                }
            )
    return out


# --- from the wire ----------------------------------------------------------------------------


def _new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def from_wire(
    data: Mapping[str, Any], *, new_id: Callable[[], str] = _new_call_id
) -> ModelResponse:
    """A ``chat.completion`` object as a ModelResponse, from its first choice.

    The body is read as `_Completion` first, so a field of the wrong type is a ProviderError
    naming it (`keel.transports.wire`). `new_id` names calls a server sent without an id:
    results are paired by id, so every call needs one that is unique in the run. A refusal
    stands in for missing text.
    """
    completion = parse(_Completion, data, PROVIDER)
    choice = completion.choices[0] if completion.choices else _Choice()
    message = choice.message or _Message()
    calls = tuple(_call(raw, new_id) for raw in message.tool_calls or () if raw.type == "function")
    return ModelResponse(
        text=_content(message.content) or message.refusal or None,
        tool_calls=calls,
        usage=_usage(completion.usage),
        stop_reason=choice.finish_reason,
        response_id=completion.id,
        model=completion.model,
    )


def _content(content: str | list[_Part] | None) -> str | None:
    if isinstance(content, list):
        return "".join(part.text or "" for part in content)
    return content


def _call(raw: _ToolCall, new_id: Callable[[], str]) -> ToolCall:
    function = raw.function or _Function()
    arguments = function.arguments
    if not isinstance(arguments, str):
        arguments = "" if arguments is None else json.dumps(arguments, ensure_ascii=False)
    return ToolCall.from_raw(raw.id or new_id(), function.name or "", arguments)


def usage(data: Mapping[str, Any] | None) -> Usage:
    """Chat usage; compatible servers may leave out the block or its details: zero, then."""
    return _usage(parse(_Usage, data or {}, PROVIDER, "usage"))


def _usage(usage: _Usage | None) -> Usage:
    if usage is None:
        return Usage()
    details = usage.prompt_tokens_details
    return Usage(
        input_tokens=usage.prompt_tokens or 0,
        output_tokens=usage.completion_tokens or 0,
        cached_input_tokens=(details.cached_tokens if details else None) or 0,
    )


# --- the shape of an answer (what is read, and no more) ---------------------------------------


class _Function(Shape):
    name: str | None = None
    arguments: JsonValue = None
    """A string of JSON by the specification; some servers send the object itself."""


class _ToolCall(Shape):
    id: str | None = None
    type: str | None = "function"
    function: _Function | None = None


class _Part(Shape):
    text: str | None = None


class _Message(Shape):
    content: str | list[_Part] | None = None
    refusal: str | None = None
    tool_calls: list[_ToolCall] | None = None


class _Choice(Shape):
    message: _Message | None = None
    finish_reason: str | None = None


class _PromptDetails(Shape):
    cached_tokens: TokenCount | None = None


class _Usage(Shape):
    prompt_tokens: TokenCount | None = None
    completion_tokens: TokenCount | None = None
    prompt_tokens_details: _PromptDetails | None = None


class _Completion(Shape):
    id: str | None = None
    model: str | None = None
    choices: list[_Choice] | None = None
    usage: _Usage | None = None
