"""Keel: an agent runtime whose runs end with an answer, a classified failure, or a durable pause.

import keel

@keel.tool(effect="read_only")
def lookup(term: str) -> str:
    "Look a term up in the glossary."
    ...

agent = keel.Agent(model="script:demo.json", tools=[lookup], limits=keel.Limits(deadline=60))
result = agent.run("What does the glossary say about leases?")
"""

# `import keel` stays cheap (issue 25, ADR 0042): the command line imports `keel.cli.app`, and
# with it this package, on every start; each public name is imported from its module on first
# use (PEP 562, keel/_lazy.py). Only underscored names are bound here, so `vars(keel)` holds the
# public surface alone.
import typing as _typing

from keel import _lazy

if _typing.TYPE_CHECKING:
    from keel.agent import Agent, RunHandle
    from keel.assemble import agent_from_options
    from keel.errors import (
        AlreadyDecided,
        BudgetExhausted,
        ConfigError,
        ContextExhausted,
        ContextOverflow,
        DeadlineExceeded,
        DecisionExpired,
        EffectUnknown,
        EmptyModelTurn,
        EndedByHook,
        FailureKind,
        HookFailed,
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
    from keel.events import ChildEvent, RunStream
    from keel.hooks import Deny, EndRun, Replace
    from keel.hosted import HostedTool
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

_WHERE: dict[str, str] = {
    "Agent": "keel.agent",
    "agent_from_options": "keel.assemble",
    "ChildEvent": "keel.events",
    "AlreadyDecided": "keel.errors",
    "AssistantMessage": "keel.messages",
    "DecisionExpired": "keel.errors",
    "Deny": "keel.hooks",
    "EndRun": "keel.hooks",
    "EndedByHook": "keel.errors",
    "HookFailed": "keel.errors",
    "Replace": "keel.hooks",
    "BudgetExhausted": "keel.errors",
    "ConfigError": "keel.errors",
    "ContextExhausted": "keel.errors",
    "ContextOverflow": "keel.errors",
    "DeadlineExceeded": "keel.errors",
    "Effect": "keel.tools.base",
    "EffectUnknown": "keel.errors",
    "EmptyModelTurn": "keel.errors",
    "Failure": "keel.result",
    "FailureKind": "keel.errors",
    "HostedTool": "keel.hosted",
    "InvalidOutput": "keel.errors",
    "KeelError": "keel.errors",
    "LeaseHeld": "keel.errors",
    "LeaseLost": "keel.errors",
    "Limits": "keel.limits",
    "McpServer": "keel.tools.mcp_servers",
    "ModelError": "keel.errors",
    "ModelRequest": "keel.messages",
    "ModelResponse": "keel.messages",
    "PendingApproval": "keel.result",
    "Price": "keel.pricing",
    "PriceTable": "keel.pricing",
    "ProviderError": "keel.errors",
    "RescuesExhausted": "keel.errors",
    "RunFailure": "keel.errors",
    "RunHandle": "keel.agent",
    "RunResult": "keel.result",
    "RunStatus": "keel.result",
    "RunStore": "keel.store",
    "RunStream": "keel.events",
    "ScriptedTransport": "keel.transports.scripted",
    "Store": "keel.store",
    "StoreError": "keel.errors",
    "StoreUnavailable": "keel.errors",
    "TextDelta": "keel.transports.streaming",
    "TextDiscarded": "keel.transports.streaming",
    "Tool": "keel.tools.base",
    "ToolCall": "keel.messages",
    "ToolDefinition": "keel.messages",
    "ToolError": "keel.errors",
    "ToolLoopDetected": "keel.errors",
    "ToolResult": "keel.messages",
    "Transport": "keel.transports.base",
    "Usage": "keel.messages",
    "UserMessage": "keel.messages",
    "browser_tools": "keel.tools.browser",
    "file_tools": "keel.tools.files",
    "mcp_tools": "keel.tools.mcp",
    "open_store": "keel.store",
    "tool": "keel.tools.base",
    "web_tools": "keel.tools.web",
    "write_tools": "keel.tools.writes",
}

__all__ = [
    "Agent",
    "AlreadyDecided",
    "AssistantMessage",
    "BudgetExhausted",
    "ChildEvent",
    "ConfigError",
    "ContextExhausted",
    "ContextOverflow",
    "DeadlineExceeded",
    "DecisionExpired",
    "Deny",
    "Effect",
    "EffectUnknown",
    "EmptyModelTurn",
    "EndRun",
    "EndedByHook",
    "Failure",
    "FailureKind",
    "HookFailed",
    "HostedTool",
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
    "Replace",
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
    "agent_from_options",
    "browser_tools",
    "file_tools",
    "mcp_tools",
    "open_store",
    "tool",
    "web_tools",
    "write_tools",
]


_public_getattr, _public_dir = _lazy.exports(__name__, _WHERE)


def __getattr__(name: str) -> _typing.Any:
    """A public name on first use; `__version__` read from the installed metadata then
    (keel/_version.py), kept like any other."""
    if name == "__version__":
        from keel._version import installed_version

        version = globals()["__version__"] = installed_version()
        return version
    return _public_getattr(name)


def __dir__() -> list[str]:
    return sorted({*_public_dir(), "__version__"})
