"""A Chat Completions server on loopback whose "model" asks for one call, then answers by
quoting the tool result it was sent: the model end of a test that must show a result (a
denial, its reason) reaching the run's answer. The wire shapes are the API's own."""

from __future__ import annotations

import json
import threading
from http.server import ThreadingHTTPServer
from typing import Any

from loopback_http import QuietHandler

__all__ = ["EchoModel"]


class EchoModel:
    def __init__(self, name: str, arguments: dict[str, Any]) -> None:
        self.call = {"name": name, "arguments": json.dumps(arguments)}
        model = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                self.reply(json.dumps(model.reply(body)).encode())

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def reply(self, body: dict[str, Any]) -> dict[str, Any]:
        last = body["messages"][-1]
        if last["role"] == "tool":
            message: dict[str, Any] = {
                "role": "assistant",
                "content": f"I did not make that change. The tool answered: {last['content']}",
            }
            finish = "stop"
        else:
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "call_w1", "type": "function", "function": self.call}],
            }
            finish = "tool_calls"
        return {
            "id": "chatcmpl-echo",
            "object": "chat.completion",
            "created": 0,
            "model": body["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 20, "completion_tokens": 9, "total_tokens": 29},
        }

    def __enter__(self) -> EchoModel:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)
