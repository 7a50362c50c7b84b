"""The public surface of `keel`, frozen: adding or removing a name is a decision, made here.

Model: httpx's tests/test_exported_members.py. Everything else in the package is reached through
its module path and may change without notice.
"""

from __future__ import annotations

import inspect
import types

import keel
import keel.errors

EXPORTED = {
    # running agents
    "Agent",
    "ChildEvent",
    "agent_from_options",
    "Limits",
    "RunHandle",
    "RunStream",
    "TextDelta",
    "TextDiscarded",
    # tools
    "Effect",
    "Tool",
    "browser_tools",
    "file_tools",
    "McpServer",
    "mcp_tools",
    "tool",
    "web_tools",
    "write_tools",
    # hooks: what they may return (keel/hooks.py, ADR 0052)
    "Deny",
    "EndRun",
    "Replace",
    # what a run ends with, and where it is kept
    "Failure",
    "FailureKind",
    "PendingApproval",
    "RunResult",
    "RunStatus",
    "RunStore",
    "Store",
    "open_store",
    # what model calls cost (keel/pricing.py, ADR 0033)
    "Price",
    "PriceTable",
    # models: the one interface, a scripted model for tests, and the messages they exchange
    "AssistantMessage",
    "ModelRequest",
    "ModelResponse",
    "ScriptedTransport",
    "ToolCall",
    "ToolDefinition",
    "ToolResult",
    "Transport",
    "Usage",
    "UserMessage",
    # the exception tree, drawn in keel/errors.py
    "AlreadyDecided",
    "BudgetExhausted",
    "ConfigError",
    "ContextExhausted",
    "ContextOverflow",
    "DeadlineExceeded",
    "DecisionExpired",
    "EffectUnknown",
    "EmptyModelTurn",
    "EndedByHook",
    "HookFailed",
    "HostedTool",
    "InvalidOutput",
    "KeelError",
    "LeaseHeld",
    "LeaseLost",
    "ModelError",
    "ProviderError",
    "RunFailure",
    "StoreError",
    "RescuesExhausted",
    "StoreUnavailable",
    "ToolError",
    "ToolLoopDetected",
}


def test_exported_names_are_frozen() -> None:
    exported = set(keel.__all__)
    assert {"missing": EXPORTED - exported, "unexpected": exported - EXPORTED} == {
        "missing": set(),
        "unexpected": set(),
    }
    assert len(keel.__all__) == len(set(keel.__all__)), "a name is listed twice"


def test_every_exported_name_exists() -> None:
    missing = [name for name in keel.__all__ if not hasattr(keel, name)]
    assert missing == []


def test_nothing_public_is_exported_by_accident() -> None:
    """Every public name bound in `keel` (submodules aside) is in `__all__`."""
    public = {
        name
        for name, value in vars(keel).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public - set(keel.__all__) == set()


def test_the_whole_exception_tree_is_exported() -> None:
    tree = {
        name
        for name, value in vars(keel.errors).items()
        if inspect.isclass(value) and issubclass(value, keel.errors.KeelError)
    }
    assert tree - set(keel.__all__) == set()
    assert tree - set(keel.errors.__all__) == set()
    assert all(getattr(keel, name) is getattr(keel.errors, name) for name in tree)


def test_lease_errors_are_keel_errors_and_the_store_raises_the_same_classes() -> None:
    import keel.store

    assert issubclass(keel.LeaseHeld, keel.KeelError)
    assert issubclass(keel.LeaseLost, keel.KeelError)
    assert keel.store.LeaseHeld is keel.LeaseHeld
    assert keel.store.LeaseLost is keel.LeaseLost
