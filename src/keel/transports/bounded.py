"""The HTTP layer under both SDKs: every response body decoded and counted as it streams in.

A provider (or whatever answers at its address) decides how much it sends. Read whole, a 300 MB
answer costs gigabytes once parsed, and a gzip bomb far more. So each SDK client Keel builds
talks through a `BoundedTransport` that wraps the HTTP client doing the real work (the SDK's
default one, or an ``httpx``/``httpx2`` client the caller passed):

- it asks for ``gzip, deflate`` only, and decompresses here, in pieces of at most `_PIECE`
  bytes (zlib's ``max_length``), so what is counted is the decompressed size and no single
  step expands a small chunk into a large one;
- it stops reading once a body, success or error, passes ``max_response_bytes``
  (`DEFAULT_MAX_RESPONSE_BYTES`), or at once when the declared length already does, closes the
  connection, and raises a `ProviderError`. An answer that was too large is not retried: the
  same question fetches the same answer. An error status keeps its own class (a 503 with a
  huge page is still a 503);
- it sends the SDK's requests through unchanged, the SDK's per-request timeout included; the
  overall time of an attempt is the gateway's (`keel.limits.Limits.model_timeout`).

The ProviderError raised while the SDK reads the body comes out of ``openai`` as it is and out
of ``anthropic`` as the cause of an ``APIConnectionError``; `keel.transports.policy.attempt`
finds it either way. The SDKs of this generation run on ``httpx2``; an injected ``httpx`` client
is bridged request by request, its exceptions mapped to httpx2's so the SDKs classify them.
"""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import httpx
import httpx2

from keel.errors import ConfigError, ProviderError
from keel.transports.policy import is_retryable

__all__ = ["ACCEPTED_ENCODINGS", "DEFAULT_MAX_RESPONSE_BYTES", "BoundedTransport", "bounded_client"]

DEFAULT_MAX_RESPONSE_BYTES = 32 * 1024 * 1024
"""32 MiB, decompressed. The longest answer a model writes today (128k output tokens) is about
half a megabyte of JSON, a few megabytes with encrypted reasoning; 32 MiB leaves room for far
more and still bounds what one attempt may hold in memory (twice this while it is joined)."""

ACCEPTED_ENCODINGS = "gzip, deflate"
"""What Keel asks for, and all it decodes (bounded, here); any other encoding is an error."""

_PIECE = 64 * 1024
_DROPPED = frozenset({"content-encoding", "content-length", "transfer-encoding"})
_KEPT_EXTENSIONS = ("http_version", "reason_phrase")

_Inner = httpx.AsyncClient | httpx2.AsyncClient


def bounded_client(inner: _Inner, *, max_bytes: int, provider: str) -> httpx2.AsyncClient:
    """An httpx2 client for an SDK that sends everything through `inner`, bounded. Its timeout
    is `inner`'s, so the SDK picks the same per-request timeout it would for `inner` itself."""
    if max_bytes < 1:
        raise ConfigError(f"max_response_bytes must be at least 1 (got {max_bytes})")
    timeout = inner.timeout
    return httpx2.AsyncClient(
        transport=BoundedTransport(inner, max_bytes=max_bytes, provider=provider),
        timeout=httpx2.Timeout(
            connect=timeout.connect, read=timeout.read, write=timeout.write, pool=timeout.pool
        ),
        trust_env=False,  # proxies from the environment are the inner client's business
    )


class BoundedTransport(httpx2.AsyncBaseTransport):
    """Sends through `inner` and hands back a body that stops at `max_bytes`, decompressed."""

    def __init__(self, inner: _Inner, *, max_bytes: int, provider: str) -> None:
        self._inner = inner
        self._max = max_bytes
        self._provider = provider

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        request.headers["accept-encoding"] = ACCEPTED_ENCODINGS
        if isinstance(self._inner, httpx.AsyncClient):
            answer: _Answer = await _send_legacy(self._inner, request)
        else:
            answer = _Answer.of(await self._inner.send(request, stream=True), _same)
        try:
            decoder = self._decoder(answer)
        except BaseException:
            await answer.close()
            raise
        headers = [(k, v) for k, v in answer.headers if k.lower() not in _DROPPED]
        return httpx2.Response(
            answer.status,
            headers=headers,
            stream=_Body(answer, decoder, self._max, lambda: self._too_large(answer.status)),
            request=request,
            extensions=answer.extensions,
        )

    def _decoder(self, answer: _Answer) -> _Inflater | None:
        coding = answer.header("content-encoding").strip().lower()
        if coding in ("", "identity"):
            declared = answer.header("content-length").strip()
            if declared.isdigit() and int(declared) > self._max:
                raise self._too_large(answer.status)
            return None
        if coding in ("gzip", "x-gzip", "deflate"):
            return _Inflater(coding)
        raise ProviderError(
            f"{self._provider}: the response is encoded as {coding[:40]!r}, which Keel did not "
            f"ask for (it accepts {ACCEPTED_ENCODINGS})"
        )

    def _too_large(self, status: int) -> ProviderError:
        failed = status >= 400
        return ProviderError(
            f"{self._provider}: the response{f' (HTTP {status})' if failed else ''} is larger "
            f"than {self._max} bytes (max_response_bytes); Keel stopped reading it",
            status=status if failed else None,
            retryable=failed and is_retryable(status),
        )


class _Answer:
    """The inner client's streamed response, whichever httpx it came from."""

    def __init__(
        self,
        status: int,
        headers: list[tuple[str, str]],
        extensions: dict[str, object],
        raw: AsyncIterator[bytes],
        close: Callable[[], Awaitable[None]],
    ) -> None:
        self.status, self.headers, self.extensions = status, headers, extensions
        self.raw, self.close = raw, close

    @classmethod
    def of(
        cls,
        response: httpx.Response | httpx2.Response,
        wrap: Callable[[AsyncIterator[bytes]], AsyncIterator[bytes]],
    ) -> _Answer:
        kept = {k: response.extensions[k] for k in _KEPT_EXTENSIONS if k in response.extensions}
        headers = list(response.headers.multi_items())
        if response.is_stream_consumed:
            # Read already (an ``httpx.MockTransport`` answer made with content=...): what it
            # holds is decoded, so it is passed on as it is, still counted.
            headers = [(k, v) for k, v in headers if k.lower() != "content-encoding"]
            raw = _once(response.content)
        else:
            raw = wrap(response.aiter_raw())
        return cls(response.status_code, headers, kept, raw, response.aclose)

    def header(self, name: str) -> str:
        return next((v for k, v in self.headers if k.lower() == name), "")


def _same(raw: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    return raw


async def _once(content: bytes) -> AsyncIterator[bytes]:
    yield content


async def _send_legacy(client: httpx.AsyncClient, request: httpx2.Request) -> _Answer:
    """`request` through an ``httpx`` client: the SDK's timeout travels along (httpx's 5 s
    default would cut long answers short); the client's other settings apply."""
    outgoing = client.build_request(
        request.method,
        str(request.url),
        headers=request.headers.multi_items(),
        content=await request.aread(),
        extensions={k: v for k, v in request.extensions.items() if k == "timeout"},
    )
    try:
        response = await client.send(outgoing, stream=True)
    except httpx.HTTPError as exc:
        raise _mapped(exc, request) from exc

    async def raw(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        try:
            async for chunk in chunks:
                yield chunk
        except httpx.HTTPError as exc:
            raise _mapped(exc, request) from exc

    return _Answer.of(response, raw)


def _mapped(exc: httpx.HTTPError, request: httpx2.Request) -> httpx2.HTTPError:
    """httpx's exception as httpx2's: the SDKs report httpx2 timeouts as timeouts and other
    transport failures as connection errors."""
    if isinstance(exc, httpx.TimeoutException):
        return httpx2.TimeoutException(str(exc), request=request)
    return httpx2.TransportError(str(exc), request=request)


class _Inflater:
    """gzip or deflate, in pieces of at most `_PIECE` bytes however well the input packs."""

    def __init__(self, coding: str) -> None:
        self._may_be_raw = coding == "deflate"  # "deflate" in the wild may lack zlib's header
        self._z = zlib.decompressobj(zlib.MAX_WBITS if self._may_be_raw else 16 + zlib.MAX_WBITS)

    def feed(self, data: bytes) -> Iterator[bytes]:
        while not self._z.eof:
            try:
                piece = self._z.decompress(data, _PIECE)
            except zlib.error as exc:
                if not self._may_be_raw:
                    raise httpx2.DecodingError(f"the compressed body is corrupt: {exc}") from None
                self._may_be_raw = False
                self._z = zlib.decompressobj(-zlib.MAX_WBITS)
                continue
            self._may_be_raw = False
            data = self._z.unconsumed_tail
            if piece:
                yield piece
            if not data and len(piece) < _PIECE:  # input used up and nothing left inside
                return


class _Body(httpx2.AsyncByteStream):
    """The decoded body, counted: `too_large()` is raised once it passes `limit` bytes."""

    def __init__(
        self,
        answer: _Answer,
        decoder: _Inflater | None,
        limit: int,
        too_large: Callable[[], ProviderError],
    ) -> None:
        self._answer, self._decoder = answer, decoder
        self._limit, self._too_large = limit, too_large

    async def __aiter__(self) -> AsyncIterator[bytes]:
        total = 0
        async for chunk in self._answer.raw:
            for piece in self._decoder.feed(chunk) if self._decoder else (chunk,):
                total += len(piece)
                if total > self._limit:
                    await self.aclose()  # the connection goes; the rest is never read
                    raise self._too_large()
                yield piece

    async def aclose(self) -> None:
        await self._answer.close()
