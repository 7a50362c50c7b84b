"""Guardrail hooks (keel/hooks.py, ADR 0052): `fetch` only inside an allow list, and e-mail
addresses redacted from every tool result before the model (or the store) sees them.

    python examples/guardrails.py                 # a scripted model: no key, no network
    KEEL_MODEL=openai:gpt-5-mini python examples/guardrails.py "your question"

The scripted run asks to fetch a page of a host outside the list (denied: the model is told
why, as after a person's denial, and nothing is fetched), then reads the team page, whose
addresses come back as [e-mail]. `keel show RUN_ID` lists both hooks' changes.
"""

from __future__ import annotations

import os
import re
import sys
from urllib.parse import urlsplit

import keel

ALLOWED_HOSTS = {"docs.python.org", "peps.python.org"}
E_MAIL = re.compile(r"[\w.+-]+@[\w-]+(\.[\w-]+)+")


class FetchAllowList:
    """Refuse `fetch` outside the allow list; every other tool goes on."""

    def __init__(self, hosts: set[str]) -> None:
        self.hosts = hosts

    def before_tool_call(self, call: keel.ToolCall) -> keel.Deny | None:
        if call.name != "fetch" or not isinstance(call.arguments, dict):
            return None
        host = urlsplit(str(call.arguments.get("url", ""))).hostname or ""
        if host in self.hosts:
            return None
        allowed = ", ".join(sorted(self.hosts))
        return keel.Deny(f"{host or 'that URL'} is not on the allow list ({allowed})")


class RedactEmails:
    """Replace e-mail addresses in every result with [e-mail] (async works as well as sync)."""

    async def after_tool_call(
        self, call: keel.ToolCall, result: keel.ToolResult
    ) -> keel.Replace | None:
        if not E_MAIL.search(result.content):
            return None
        return keel.Replace(E_MAIL.sub("[e-mail]", result.content))


@keel.tool(effect="read_only")
def team_page() -> str:
    """The team page: who works on what, and how to reach them."""
    return "Ana (runtime): ana@example.com\nBo (stores): bo.smith@example.org"


SCRIPT = {
    "turns": [
        {"tool_calls": [{"name": "fetch", "arguments": {"url": "https://example.net/leak"}}]},
        {"tool_calls": [{"name": "team_page", "arguments": {}}]},
        {"text": "Ana works on the runtime and Bo on the stores; their addresses are withheld."},
    ]
}


def main() -> None:
    question = sys.argv[1] if len(sys.argv) > 1 else "Who works on the runtime?"
    model = os.environ.get("KEEL_MODEL") or keel.ScriptedTransport.from_dict(SCRIPT)
    with keel.Agent(
        model,
        tools=[*keel.web_tools(), team_page],
        hooks=[FetchAllowList(ALLOWED_HOSTS), RedactEmails()],
        store=":memory:" if not os.environ.get("KEEL_MODEL") else None,
    ) as agent:
        result = agent.run(question)
        print(result.status, "-", result.answer)
        for event in agent.store.events(result.run_id):
            if event.type == "hook_applied":
                print("hook:", event.hook, event.point, event.action)  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
