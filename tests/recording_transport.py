"""An httpx transport for tests of a client's real outgoing requests."""

from __future__ import annotations

from typing import Any

import httpx


class Recorder:
    """An httpx transport that keeps each request the client sent and answers `answer`."""

    def __init__(self, status: int, **answer: Any) -> None:
        self.requests: list[httpx.Request] = []
        self.status = status
        self.answer = answer

    def transport(self) -> httpx.MockTransport:
        def handle(request: httpx.Request) -> httpx.Response:
            request.read()
            self.requests.append(request)
            return httpx.Response(self.status, **self.answer)

        return httpx.MockTransport(handle)
