"""Keel: an agent runtime whose runs end with an answer, a classified failure, or a durable pause.

import keel

@keel.tool(effect="read_only")
def lookup(term: str) -> str:
    "Look a term up in the glossary."
    ...

agent = keel.Agent(model="script:demo.json", tools=[lookup], limits=keel.Limits(deadline=60))
result = agent.run("What does the glossary say about leases?")
"""

from keel.agent import Agent, RunHandle
from keel.errors import (
    AlreadyDecided,
    BudgetExhausted,
    ConfigError,
    DeadlineExceeded,
    EffectUnknown,
    EmptyModelTurn,
    FailureKind,
    InvalidOutput,
    KeelError,
    LeaseHeld,
    LeaseLost,
    ModelError,
    ProviderError,
    RescuesExhausted,
    RunFailure,
    StoreError,
    StoreUnavailable,
    ToolError,
    ToolLoopDetected,
)
from keel.events import RunStream
from keel.limits import Limits
from keel.messages import (
    AssistantMessage,
    ModelRequest,
    ModelResponse,
    ToolCall,
    ToolDefinition,
    ToolResult,
    Usage,
    UserMessage,
)
from keel.pricing import Price, PriceTable
from keel.result import Failure, PendingApproval, RunResult, RunStatus
from keel.store import RunStore, Store, open_store
from keel.tools.base import Effect, Tool, tool
from keel.tools.browser import browser_tools
from keel.tools.files import file_tools
from keel.tools.mcp import mcp_tools
from keel.tools.mcp_servers import McpServer
from keel.tools.web import web_tools
from keel.tools.writes import write_tools
from keel.transports.base import Transport
from keel.transports.scripted import ScriptedTransport
from keel.transports.streaming import TextDelta, TextDiscarded

__all__ = [
    "Agent",
    "AlreadyDecided",
    "AssistantMessage",
    "BudgetExhausted",
    "ConfigError",
    "DeadlineExceeded",
    "Effect",
    "EffectUnknown",
    "EmptyModelTurn",
    "Failure",
    "FailureKind",
    "InvalidOutput",
    "KeelError",
    "LeaseHeld",
    "LeaseLost",
    "Limits",
    "McpServer",
    "ModelError",
    "ModelRequest",
    "ModelResponse",
    "PendingApproval",
    "Price",
    "PriceTable",
    "ProviderError",
    "RescuesExhausted",
    "RunFailure",
    "RunHandle",
    "RunResult",
    "RunStatus",
    "RunStore",
    "RunStream",
    "ScriptedTransport",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "TextDelta",
    "TextDiscarded",
    "Tool",
    "ToolCall",
    "ToolDefinition",
    "ToolError",
    "ToolLoopDetected",
    "ToolResult",
    "Transport",
    "Usage",
    "UserMessage",
    "browser_tools",
    "file_tools",
    "mcp_tools",
    "open_store",
    "tool",
    "web_tools",
    "write_tools",
]
