"""Tool timeouts tell the truth about what was stopped, and a stuck tool thread never keeps the
process alive."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from isolated import run_python
from keel.messages import ToolCall
from keel.tools.base import Effect, Tool, make_tool
from keel.tools.executor import ExecutedCall, ToolExecutor


def call(name: str, arguments: dict[str, Any] | None = None) -> ToolCall:
    return ToolCall.from_arguments("c1", name, arguments or {})


async def run_one(tool: Tool, c: ToolCall, deadline: float | None = None) -> ExecutedCall:
    (executed,) = await ToolExecutor([tool]).run_batch([c], deadline=deadline)
    return executed


# -- timeouts: a side effect that may have happened is "effect unknown" --------------------


def slow_payment(seconds: float, done: threading.Event, timeout: float = 0.1) -> Tool:
    def pay(amount: int) -> str:
        """Pay someone."""
        time.sleep(seconds)
        done.set()
        return f"paid {amount}"

    return make_tool(pay, effect=Effect.SIDE_EFFECTING, timeout=timeout)


def assert_effect_unknown(executed: ExecutedCall) -> None:
    result = executed.result
    assert result.is_error and result.uncertain and executed.timed_out and executed.dispatched
    assert "effect unknown" in result.content.lower()
    assert "do not repeat it blindly" in result.content
    assert "was stopped" not in result.content and "Try a smaller request" not in result.content


async def test_side_effect_timeout_is_effect_unknown() -> None:
    done = threading.Event()
    executed = await run_one(slow_payment(0.4, done), call("pay", {"amount": 5}))
    assert_effect_unknown(executed)
    assert await asyncio.to_thread(done.wait, 5)  # the thread went on: the payment happened


async def test_side_effect_cut_by_the_deadline_is_effect_unknown() -> None:
    done = threading.Event()
    tool = slow_payment(0.4, done, timeout=30)
    deadline = asyncio.get_running_loop().time() + 0.1
    executed = await run_one(tool, call("pay", {"amount": 5}), deadline=deadline)
    assert_effect_unknown(executed)
    assert "deadline" in executed.result.content


async def test_async_side_effect_timeout_is_effect_unknown_though_stopped() -> None:
    async def transfer() -> str:
        """Move money."""
        await asyncio.sleep(30)
        return "moved"

    tool = make_tool(transfer, effect=Effect.SIDE_EFFECTING, timeout=0.05)
    executed = await run_one(tool, call("transfer"))
    assert executed.result.uncertain and "effect unknown" in executed.result.content.lower()


async def test_a_thread_tool_timeout_never_claims_the_thread_was_stopped() -> None:
    def crawl() -> str:
        """Read a lot."""
        time.sleep(0.4)
        return "all of it"

    executed = await run_one(make_tool(crawl, timeout=0.05), call("crawl"))
    text = executed.result.content
    assert executed.timed_out and executed.result.is_error and not executed.result.uncertain
    assert "timed out" in text and "was stopped" not in text
    assert "abandoned" in text and "discarded" in text


async def test_an_async_tool_timeout_says_it_was_stopped_and_really_stops_it() -> None:
    finished = []

    async def poll() -> str:
        """Poll."""
        await asyncio.sleep(0.3)
        finished.append(1)
        return "late"

    executed = await run_one(make_tool(poll, timeout=0.05), call("poll"))
    assert "was stopped" in executed.result.content and not executed.result.uncertain
    await asyncio.sleep(0.4)
    assert finished == []


def test_a_stuck_tool_thread_never_keeps_the_process_alive() -> None:
    proc = run_python(
        """
        import asyncio, threading
        from keel.messages import ToolCall
        from keel.tools.base import make_tool
        from keel.tools.executor import ToolExecutor

        def stuck() -> str:
            "Never returns."
            threading.Event().wait()
            return "never"

        async def main() -> None:
            executor = ToolExecutor([make_tool(stuck, timeout=0.2)])
            (done,) = await executor.run_batch([ToolCall.from_arguments("c", "stuck", {})])
            print(done.result.content, flush=True)

        asyncio.run(main())
        print("exited", flush=True)
        """,
        timeout=20,
    )
    assert proc.returncode == 0, proc.stderr
    assert "timed out" in proc.stdout and proc.stdout.rstrip().endswith("exited")
