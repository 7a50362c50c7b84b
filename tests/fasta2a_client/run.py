"""fasta2a against `keel serve` (run by tests/test_serve_a2a_fasta2a.py in fasta2a's own venv).

fasta2a's own `A2AClient` does everything, as a user's program would: it reads and validates
the card (`fetch_card=True`, its own schema), sends `message/send` and `message/stream` and
`tasks/get` (A2A 0.3 method names, no A2A-Version header, `tasks/get` with `"id": null`) to the
card's first URL with "/" after it, and validates each answer with its own schema: a send's
result in a `{"task": ...}` wrapper, a stream's events as `{"task"|"statusUpdate"|...: ...}`.
What it parsed is printed, one JSON object per line; an answer it read as empty (`{}`) is
printed as it came, for the test to see. With a reply text, an input-required task gets that
text on its task id; then a second question is streamed."""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from typing import Any

from fasta2a.client import A2AClient


def message(text: str, task_id: str | None = None) -> Any:
    sent: dict[str, Any] = {
        "role": "user", "message_id": uuid.uuid4().hex, "parts": [{"text": text}],
    }  # fmt: skip
    if task_id is not None:
        sent["task_id"] = task_id
    return sent


def show(kind: str, value: Any) -> None:
    print(json.dumps({"kind": kind, kind: value}), flush=True)


async def settle(client: A2AClient, task_id: str) -> dict[str, Any]:
    for _ in range(200):
        got = await client.get_task(task_id)  # fasta2a sends "id": null
        if "result" not in got:
            return dict(got)
        task = got["result"]
        if task["status"]["state"] not in ("submitted", "working"):
            break
        await asyncio.sleep(0.1)
    return dict(task)


async def main(url: str, question: str, reply: str | None) -> None:
    client = A2AClient(url, fetch_card=True)  # validates the card with fasta2a's schema
    assert client.agent_card is not None
    show("card", {"skills": client.agent_card["skills"]})
    sent = await client.send_message(message(question))
    show("sent", sent)
    task = (sent.get("result") or {}).get("task")
    if task is None:
        return
    task = await settle(client, task["id"])
    show("task", task)
    if reply is not None and task.get("status", {}).get("state") == "input-required":
        answered = await client.send_message(message(reply, task["id"]))
        show("sent", answered)
        if "task" in (answered.get("result") or {}):
            show("task", await settle(client, task["id"]))
    events = [event async for event in client.stream_message(message(question))]
    show("streamed", events)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None))
