"""Token counting for the context budget.

Counting must never download anything and never crash. Until a model brings its own tokenizer,
Keel uses a calibrated estimate: bytes of UTF-8 divided by a ratio measured on research text
(English prose, code and JSON average about 3.6 bytes per token on BPE vocabularies of the
Qwen and GPT-4 families). Items are counted once, when they enter the history.
"""

from __future__ import annotations

from typing import Protocol

from keel.messages import AssistantMessage, Item, ToolResult, UserMessage

__all__ = [
    "MESSAGE_OVERHEAD",
    "EstimatingCounter",
    "TokenCounter",
    "item_tokens",
]

MESSAGE_OVERHEAD = 4
"""Tokens a chat template spends around each message (role markers, separators)."""


class TokenCounter(Protocol):
    def count(self, text: str) -> int: ...


class EstimatingCounter:
    """A fast, offline estimate; good to a few percent on mixed research text."""

    def __init__(self, bytes_per_token: float = 3.6) -> None:
        if bytes_per_token <= 0:
            raise ValueError("bytes_per_token must be positive")
        self.bytes_per_token = bytes_per_token

    def count(self, text: str) -> int:
        if not text:
            return 0
        size = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
        return int(size / self.bytes_per_token) + 1


def item_tokens(counter: TokenCounter, item: Item) -> int:
    """Tokens one history item costs in a request (content plus framing)."""
    match item:
        case UserMessage(text=text):
            return MESSAGE_OVERHEAD + counter.count(text)
        case AssistantMessage(text=text, tool_calls=calls):
            total = MESSAGE_OVERHEAD + counter.count(text or "")
            for call in calls:
                total += (
                    MESSAGE_OVERHEAD + counter.count(call.name) + counter.count(call.raw_arguments)
                )
            return total
        case ToolResult(content=content):
            return MESSAGE_OVERHEAD + counter.count(content)
    raise TypeError(f"unknown history item: {item!r}")
