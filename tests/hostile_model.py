"""A Chat Completions server on loopback that writes exactly the tool calls a test scripts, ids
and all: a careless or hostile provider that reuses call ids, within one turn and across turns.

It keeps no position: the turn it answers is the number of assistant messages in the request,
so a run resumed by another process (or another agent) gets the turn it would have got. Every
request body is kept, so a test can check what went on the wire.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from http.server import ThreadingHTTPServer
from typing import Any

from loopback_http import QuietHandler, serving

__all__ = ["HostileModel", "Turn", "wire_problems"]

Turn = str | Sequence[tuple[str, str, dict[str, Any]]]
"""An answer's text, or the calls of a turn as (provider id, tool name, arguments)."""


class HostileModel:
    def __init__(self, turns: Sequence[Turn]) -> None:
        self.turns = list(turns)
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        model = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                with model._lock:
                    model.requests.append(body)
                self.reply(json.dumps(model.reply(body)).encode())

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self._serving = serving(self.server)

    def reply(self, body: dict[str, Any]) -> dict[str, Any]:
        turn = self.turns[sum(m["role"] == "assistant" for m in body["messages"])]
        if isinstance(turn, str):
            message: dict[str, Any] = {"role": "assistant", "content": turn}
            finish = "stop"
        else:
            calls = [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(arguments)},
                }
                for call_id, name, arguments in turn
            ]
            message = {"role": "assistant", "content": None, "tool_calls": calls}
            finish = "tool_calls"
        return {
            "id": "chatcmpl-hostile",
            "object": "chat.completion",
            "created": 0,
            "model": body["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 20, "completion_tokens": 9, "total_tokens": 29},
        }

    def __enter__(self) -> HostileModel:
        self._serving.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._serving.__exit__(None, None, None)


def wire_problems(body: dict[str, Any]) -> list[str]:
    """What a provider would refuse in a Chat Completions request: a call id used twice, a tool
    message answering no call or a call already answered, a call left unanswered."""
    problems: list[str] = []
    asked: set[str] = set()
    answered: set[str] = set()
    for message in body["messages"]:
        for call in message.get("tool_calls") or ():
            if call["id"] in asked:
                problems.append(f"call id {call['id']} sent twice")
            asked.add(call["id"])
        if message["role"] == "tool":
            answer = message["tool_call_id"]
            if answer not in asked or answer in answered:
                problems.append(f"tool message {answer} answers no open call")
            answered.add(answer)
    problems.extend(f"call {c} unanswered" for c in sorted(asked - answered))
    return problems
