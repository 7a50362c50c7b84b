"""ToolError carries a tool's own message to the model, and approval predicates never crash a
run."""

from __future__ import annotations

from typing import Any

import pytest

from keel import errors
from keel.messages import ToolCall
from keel.tools.base import Tool, ToolArgumentError, make_tool
from keel.tools.browser_session import BrowserError
from keel.tools.executor import ExecutedCall, ToolExecutor
from keel.tools.files import FileToolError
from keel.tools.web import FetchError


def call(name: str, arguments: dict[str, Any] | None = None) -> ToolCall:
    return ToolCall.from_arguments("c1", name, arguments or {})


async def run_one(tool: Tool, c: ToolCall, deadline: float | None = None) -> ExecutedCall:
    (executed,) = await ToolExecutor([tool]).run_batch([c], deadline=deadline)
    return executed


# -- ToolError: a tool's own message for the model ------------------------------------------


async def test_a_tool_raising_tool_error_gives_the_model_its_message() -> None:
    def refuse(x: int) -> str:
        """Refuses."""
        raise errors.ToolError("x")

    executed = await run_one(make_tool(refuse), call("refuse", {"x": 1}))
    assert executed.result.is_error and executed.dispatched
    assert executed.result.content == "x"


def test_every_built_in_tool_error_is_a_tool_error() -> None:
    for cls in (ToolArgumentError, FileToolError, FetchError, BrowserError):
        assert issubclass(cls, errors.ToolError), cls
    assert issubclass(errors.ToolError, errors.KeelError)


# -- approval predicates --------------------------------------------------------------------


def pay(to: str, amount: int = 500) -> str:
    """Pay someone."""
    return f"paid {amount} to {to}"


def test_an_approval_predicate_never_sees_arguments_that_fail_the_schema() -> None:
    tool = make_tool(pay, requires_approval=lambda args: args["to"].startswith("x"))
    assert tool.needs_approval({"amount": 5}) is False  # "to" missing: answered as invalid
    assert tool.needs_approval({"to": 3}) is False
    assert tool.needs_approval({"to": "xavier"}) is True


def test_an_approval_predicate_sees_the_validated_arguments_with_defaults() -> None:
    tool = make_tool(pay, requires_approval=lambda args: args["amount"] > 100)
    assert tool.needs_approval({"to": "bob"}) is True
    assert tool.needs_approval({"to": "bob", "amount": "50"}) is False


def test_a_raising_approval_predicate_raises_tool_error_naming_the_tool() -> None:
    def broken(args: dict[str, Any]) -> bool:
        raise ValueError("ledger offline")

    tool = make_tool(pay, requires_approval=broken)
    with pytest.raises(errors.ToolError, match=r"pay.*ValueError: ledger offline"):
        tool.needs_approval({"to": "bob"})
