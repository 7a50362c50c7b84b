"""Google ADK's `RemoteA2aAgent` against `keel serve` (run by tests/test_serve_a2a_adk.py in
ADK's own venv).

ADK reads Keel's card, sends the question through its own A2A client, and turns the task's
`input-required` into a function call of its own (`mock_function_call_for_required_user_input`,
the status text as its argument). The reply is what an ADK app sends to resume: a function
response to that call, its `response` one of the JSON objects given on the command line, each
in a session (and so a task) of its own. Each ADK event and each request ADK posts is printed,
one JSON object per line, with the number of its case."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import httpx
from google.adk.a2a.agent import RemoteA2aAgent
from google.adk.runners import Runner
from google.adk.sessions import InMemorySessionService
from google.genai import types

APP, USER = "keel-adk-test", "user"


CASE = [0]


def show(kind: str, **fields: Any) -> None:
    print(json.dumps({"kind": kind, "case": CASE[0], **fields}, default=str), flush=True)


async def posted(request: httpx.Request) -> None:
    if request.method == "POST":
        show("wire", url=str(request.url), body=json.loads(request.content or b"null"))


def parts_of(event: Any) -> list[dict[str, Any]]:
    content = event.content
    if content is None or not content.parts:
        return []
    return [p.model_dump(mode="json", exclude_none=True) for p in content.parts]


async def turn(runner: Runner, session_id: str, message: types.Content) -> list[Any]:
    events = []
    async for event in runner.run_async(user_id=USER, session_id=session_id, new_message=message):
        show("event", author=event.author, parts=parts_of(event),
             long_running=sorted(event.long_running_tool_ids or ()))  # fmt: skip
        events.append(event)
    return events


async def case(runner: Runner, question: str, response: dict[str, Any]) -> None:
    session = await runner.session_service.create_session(app_name=APP, user_id=USER)
    asked = types.Content(role="user", parts=[types.Part(text=question)])
    events = await turn(runner, session.id, asked)
    calls = [
        call
        for event in events
        for call in event.get_function_calls()
        if call.id in (event.long_running_tool_ids or ())
    ]
    show("calls", calls=[c.model_dump(mode="json", exclude_none=True) for c in calls])
    if not calls:
        return
    call = calls[-1]  # ADK makes one per pause event it relays (the stream's, the task's)
    reply = types.Part(
        function_response=types.FunctionResponse(id=call.id, name=call.name, response=response)
    )
    await turn(runner, session.id, types.Content(role="user", parts=[reply]))


async def main(url: str, question: str, responses: list[dict[str, Any]]) -> None:
    http = httpx.AsyncClient(timeout=60, event_hooks={"request": [posted]})
    agent = RemoteA2aAgent(
        name="keel", agent_card=f"{url}/.well-known/agent-card.json", httpx_client=http
    )
    runner = Runner(app_name=APP, agent=agent, session_service=InMemorySessionService())
    for number, response in enumerate(responses):
        CASE[0] = number
        await case(runner, question, response)
    await http.aclose()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], [json.loads(a) for a in sys.argv[3:]]))
