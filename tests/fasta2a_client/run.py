"""fasta2a against `keel serve` (run by tests/test_serve_a2a_fasta2a.py in fasta2a's own venv).

fasta2a's `A2AClient` reads and validates the card (`fetch_card=True`, its own schema), then
each request is written by fasta2a's own serializer (`message/send`, `tasks/get`: A2A 0.3
method names, no A2A-Version header) and posted where its client posts it (the card's first
URL, then "/"). The answers are printed raw: fasta2a's client reads a send's result in 1.0's
`{"task": ...}` wrapper, which no 0.3 server writes, so `A2AClient.send_message` would hand
back `{}`; the test reads them as 0.3 (and `tasks/get` is sent with an id: fasta2a's own
sends `"id": null`, which 0.3 does not allow). With a reply text, an input-required task gets
that text on its task id. One JSON object per line."""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from typing import Any

import httpx
from fasta2a.client import A2AClient
from fasta2a.schema import (
    GetTaskRequest,
    MessageSendParams,
    SendMessageRequest,
    a2a_request_ta,
    send_message_request_ta,
)


def message(text: str, task_id: str | None = None) -> Any:
    sent: dict[str, Any] = {
        "role": "user", "message_id": uuid.uuid4().hex, "parts": [{"text": text}],
    }  # fmt: skip
    if task_id is not None:
        sent["task_id"] = task_id
    return sent


async def post(http: httpx.AsyncClient, content: bytes) -> dict[str, Any]:
    answer = await http.post("/", content=content, headers={"Content-Type": "application/json"})
    answer.raise_for_status()
    said: dict[str, Any] = answer.json()
    return said


async def send(http: httpx.AsyncClient, text: str, task_id: str | None = None) -> dict[str, Any]:
    params = MessageSendParams(message=message(text, task_id))
    request = SendMessageRequest(jsonrpc="2.0", id=uuid.uuid4().hex, method="message/send",
                                 params=params)  # fmt: skip
    return await post(http, send_message_request_ta.dump_json(request, by_alias=True))


async def settle(http: httpx.AsyncClient, task_id: str) -> dict[str, Any]:
    # fasta2a's get_task sends "id": null, which the 0.3 spec does not allow (a string or a
    # number) and the a2a-sdk refuses: an id is given here
    request = GetTaskRequest(jsonrpc="2.0", id="get", method="tasks/get", params={"id": task_id})
    for _ in range(200):
        task = (await post(http, a2a_request_ta.dump_json(request, by_alias=True)))["result"]
        if task["status"]["state"] not in ("submitted", "working"):
            break
        await asyncio.sleep(0.1)
    return dict(task)


async def main(url: str, question: str, reply: str | None) -> None:
    client = A2AClient(url, fetch_card=True)  # validates the card with fasta2a's schema
    assert client.agent_card is not None
    print(json.dumps({"kind": "card", "skills": client.agent_card["skills"]}))
    http = client.http_client
    sent = await send(http, question)
    print(json.dumps({"kind": "sent", "answer": sent}))
    if "error" in sent:
        return
    task = await settle(http, sent["result"]["id"])
    print(json.dumps({"kind": "task", "task": task}))
    if reply is not None and task["status"]["state"] == "input-required":
        answered = await send(http, reply, task["id"])
        print(json.dumps({"kind": "sent", "answer": answered}))
        if "error" not in answered:
            print(json.dumps({"kind": "task", "task": await settle(http, task["id"])}))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None))
