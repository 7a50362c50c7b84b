"""ToolExecutor: errors are results, effects decide concurrency, big results are capped."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any

import pydantic
import pytest

from keel.errors import ConfigError
from keel.messages import ToolCall, digest_text
from keel.tools.base import Effect, Tool, make_tool
from keel.tools.executor import ExecutedCall, ToolExecutor


def call(name: str, arguments: dict[str, Any] | None = None, id: str = "c1") -> ToolCall:
    return ToolCall.from_arguments(id, name, arguments or {})


def add(a: int, b: int = 1) -> int:
    """Add two integers."""
    return a + b


async def shout(text: str) -> str:
    """Say it louder."""
    return text.upper()


class Query(pydantic.BaseModel):
    """A search query."""

    q: str
    limit: int = pydantic.Field(default=3, ge=1)


def search(query: Query) -> list[str]:
    """Search for things."""
    return [f"{query.q}-{i}" for i in range(query.limit)]


async def run_one(tools: list[Tool], c: ToolCall, **kwargs: Any) -> ExecutedCall:
    (executed,) = await ToolExecutor(tools, **kwargs).run_batch([c])
    return executed


# -- construction -------------------------------------------------------------------------


def test_duplicate_tool_names_are_a_config_error() -> None:
    with pytest.raises(ConfigError, match="add"):
        ToolExecutor([make_tool(add), make_tool(add)])


def test_definitions_keep_the_given_order_and_are_computed_once() -> None:
    executor = ToolExecutor([make_tool(shout), make_tool(add), make_tool(search)])
    assert [d.name for d in executor.definitions] == ["shout", "add", "search"]
    assert executor.definitions is executor.definitions
    assert executor.get("add") is not None and executor.get("nope") is None


# -- tools from functions and models ------------------------------------------------------


async def test_plain_sync_function_tool_runs_with_validated_arguments() -> None:
    executed = await run_one([make_tool(add)], call("add", {"a": 2, "b": 5}))
    assert executed.result.content == "7"
    assert not executed.result.is_error and executed.dispatched and not executed.timed_out


async def test_plain_async_function_tool_runs() -> None:
    executed = await run_one([make_tool(shout)], call("shout", {"text": "hi"}))
    assert executed.result.content == "HI"


async def test_pydantic_model_parameter_tool_gets_the_model() -> None:
    tool = make_tool(search)
    assert tool.parameters["properties"]["q"]["type"] == "string"
    executed = await run_one([tool], call("search", {"q": "keel", "limit": 2}))
    assert json.loads(executed.result.content) == ["keel-0", "keel-1"]


async def test_annotated_field_descriptions_and_constraints_reach_the_model_and_the_check() -> None:
    """`Annotated[T, pydantic.Field(...)]` on a plain function's parameter: the description goes
    into the JSON Schema the model reads, and the constraint is checked before the tool runs."""

    def pick(
        term: Annotated[str, pydantic.Field(description="A glossary term", max_length=8)],
    ) -> str:
        """Pick a term."""
        return term.upper()

    tool = make_tool(pick)
    assert tool.parameters["properties"]["term"]["description"] == "A glossary term"
    assert (await run_one([tool], call("pick", {"term": "lease"}))).result.content == "LEASE"
    refused = await run_one([tool], call("pick", {"term": "a-much-too-long-term"}))
    assert refused.result.is_error and not refused.dispatched


async def test_result_carries_call_identity_size_and_digest() -> None:
    c = ToolCall.from_arguments("call-9", "shout", {"text": "abc"})
    executed = await run_one([make_tool(shout)], c)
    result = executed.result
    assert (result.call_id, result.name, result.call_key) == ("call-9", "shout", c.key)
    assert result.size == 3 and result.digest == digest_text("ABC")
    assert not result.truncated and executed.full_content is None


# -- errors become results ----------------------------------------------------------------


async def test_invalid_json_arguments_become_an_error_result() -> None:
    ran = []

    def record(x: int) -> int:
        """Record."""
        ran.append(x)
        return x

    c = ToolCall.from_raw("c1", "record", '{"x": 1')
    executed = await run_one([make_tool(record)], c)
    assert executed.result.is_error and not executed.dispatched
    assert "not valid JSON" in executed.result.content
    assert ran == []


async def test_unknown_tool_error_names_the_available_tools() -> None:
    executed = await run_one([make_tool(add), make_tool(shout)], call("shuot", {"text": "x"}))
    content = executed.result.content
    assert executed.result.is_error and not executed.dispatched
    assert "'shuot'" in content and "add, shout" in content
    assert "Did you mean 'shout'?" in content


async def test_schema_violation_becomes_an_error_result_naming_the_field() -> None:
    executed = await run_one([make_tool(add)], call("add", {"a": "two"}))
    assert executed.result.is_error and not executed.dispatched
    assert "invalid arguments for add" in executed.result.content
    assert "a:" in executed.result.content


async def test_model_field_constraint_violation_is_an_error_result() -> None:
    executed = await run_one([make_tool(search)], call("search", {"q": "x", "limit": 0}))
    assert executed.result.is_error and "limit" in executed.result.content


async def test_a_raising_tool_becomes_an_error_result_with_type_and_message() -> None:
    def broken(path: str) -> str:
        """Always fails."""
        raise FileNotFoundError(f"no such file: {path}")

    executed = await run_one([make_tool(broken)], call("broken", {"path": "a.txt"}))
    assert executed.result.is_error and executed.dispatched and not executed.timed_out
    assert "FileNotFoundError" in executed.result.content
    assert "no such file: a.txt" in executed.result.content


async def test_a_tool_raising_its_own_timeout_error_is_not_reported_as_timed_out() -> None:
    async def upstream() -> str:
        """Fails with the upstream's timeout."""
        raise TimeoutError("upstream gave up")

    executed = await run_one([make_tool(upstream)], call("upstream"))
    assert executed.result.is_error and not executed.timed_out
    assert "upstream gave up" in executed.result.content


async def test_a_slow_tool_times_out_into_an_error_result() -> None:
    async def slow() -> str:
        """Takes forever."""
        await asyncio.sleep(30)
        return "never"

    executed = await run_one([make_tool(slow, timeout=0.05)], call("slow"))
    assert executed.timed_out and executed.dispatched and executed.result.is_error
    assert "timed out" in executed.result.content
    assert executed.duration_ms < 5000


async def test_the_run_deadline_shortens_the_tool_timeout() -> None:
    async def slow() -> str:
        """Takes forever."""
        await asyncio.sleep(30)
        return "never"

    deadline = asyncio.get_running_loop().time() + 0.05
    executor = ToolExecutor([make_tool(slow, timeout=60)])
    (executed,) = await executor.run_batch([call("slow")], deadline=deadline)
    assert executed.timed_out and "deadline" in executed.result.content


async def test_no_time_left_means_the_call_is_not_dispatched() -> None:
    ran = []
    dispatched: list[str] = []

    async def work() -> str:
        """Work."""
        ran.append(1)
        return "done"

    async def on_dispatch(c: ToolCall, tool: Tool) -> None:
        dispatched.append(c.id)

    deadline = asyncio.get_running_loop().time() - 1
    executor = ToolExecutor([make_tool(work)])
    (executed,) = await executor.run_batch(
        [call("work")], deadline=deadline, on_dispatch=on_dispatch
    )
    assert executed.timed_out and not executed.dispatched and executed.result.is_error
    assert ran == [] and dispatched == []


async def test_cancellation_propagates_out_of_the_batch() -> None:
    started = asyncio.Event()

    async def hang() -> str:
        """Hang."""
        started.set()
        await asyncio.sleep(30)
        return "never"

    task = asyncio.create_task(ToolExecutor([make_tool(hang)]).run_batch([call("hang")]))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


# -- concurrency and order ----------------------------------------------------------------


async def test_read_only_and_observation_calls_really_run_concurrently() -> None:
    """Each call waits for the other to have started: only overlapping runs can finish."""
    started = {"a": asyncio.Event(), "b": asyncio.Event()}

    async def meet(me: str, other: str) -> str:
        """Wait for the other call."""
        started[me].set()
        await asyncio.wait_for(started[other].wait(), timeout=2)
        return f"{me} met {other}"

    reader = make_tool(meet, name="reader", effect=Effect.READ_ONLY)
    watcher = make_tool(meet, name="watcher", effect=Effect.OBSERVATION)
    executed = await ToolExecutor([reader, watcher]).run_batch(
        [
            call("reader", {"me": "a", "other": "b"}, id="1"),
            call("watcher", {"me": "b", "other": "a"}, id="2"),
        ]
    )
    assert [e.result.content for e in executed] == ["a met b", "b met a"]
    assert not any(e.result.is_error for e in executed)


async def test_side_effecting_calls_run_alone_in_request_order() -> None:
    log: list[str] = []
    active = 0
    peak = 0

    async def write(label: str, pause: float) -> str:
        """Write something."""
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        log.append(f"start {label}")
        await asyncio.sleep(pause)
        log.append(f"end {label}")
        active -= 1
        return label

    writer = make_tool(write, effect=Effect.SIDE_EFFECTING)
    calls = [
        call("write", {"label": "first", "pause": 0.03}, id="1"),
        call("write", {"label": "second", "pause": 0.0}, id="2"),
        call("write", {"label": "third", "pause": 0.01}, id="3"),
    ]
    executed = await ToolExecutor([writer]).run_batch(calls)
    assert peak == 1
    assert log == [
        "start first",
        "end first",
        "start second",
        "end second",
        "start third",
        "end third",
    ]
    assert [e.result.content for e in executed] == ["first", "second", "third"]


async def test_a_write_is_a_barrier_so_a_later_read_sees_it() -> None:
    state = {"value": "old"}

    async def read() -> str:
        """Read the value."""
        return state["value"]

    async def write(value: str) -> str:
        """Write the value."""
        await asyncio.sleep(0.01)
        state["value"] = value
        return "ok"

    executor = ToolExecutor([make_tool(read), make_tool(write, effect="side_effecting")])
    executed = await executor.run_batch(
        [call("read", id="1"), call("write", {"value": "new"}, id="2"), call("read", id="3")]
    )
    assert [e.result.content for e in executed] == ["old", "ok", "new"]


async def test_results_come_back_in_request_order_whatever_finishes_first() -> None:
    async def nap(label: str, pause: float) -> str:
        """Sleep, then answer."""
        await asyncio.sleep(pause)
        return label

    executor = ToolExecutor([make_tool(nap), make_tool(add)])
    calls = [
        call("nap", {"label": "slow", "pause": 0.05}, id="1"),
        call("missing", id="2"),
        call("nap", {"label": "fast", "pause": 0.0}, id="3"),
        call("add", {"a": 1}, id="4"),
    ]
    executed = await executor.run_batch(calls)
    assert [e.call.id for e in executed] == ["1", "2", "3", "4"]
    assert [e.result.call_id for e in executed] == ["1", "2", "3", "4"]
    assert [e.result.content for e in executed][0::2] == ["slow", "fast"]
    assert executed[1].result.is_error and executed[3].result.content == "2"


async def test_on_dispatch_is_awaited_before_each_dispatched_call_only() -> None:
    events: list[str] = []

    async def act(x: int) -> str:
        """Act."""
        events.append(f"run {x}")
        return "ok"

    async def on_dispatch(c: ToolCall, tool: Tool) -> None:
        events.append(f"dispatch {c.id} {tool.effect.value}")

    executor = ToolExecutor([make_tool(act, effect=Effect.SIDE_EFFECTING)])
    await executor.run_batch(
        [call("act", {"x": 1}, id="a"), call("act", {"x": "bad"}, id="b")],
        on_dispatch=on_dispatch,
    )
    assert events == ["dispatch a side_effecting", "run 1"]


# -- size cap -----------------------------------------------------------------------------


async def test_long_results_are_truncated_with_a_marker_and_digest() -> None:
    full = "".join(f"{i:04d}" for i in range(60))  # 240 characters

    def big() -> str:
        """A big result."""
        return full

    executed = await run_one([make_tool(big)], call("big"), max_result_chars=100)
    result = executed.result
    digest = digest_text(full)
    assert result.truncated and result.size == 240 and result.digest == digest
    assert result.content.startswith(full[:100] + "\n")
    assert full[100:110] not in result.content
    assert result.content.endswith(
        f"[truncated: showing 100 of 240 characters; full result sha256:{digest[:16]} "
        "kept in the run's store]"
    )
    assert executed.full_content == full


async def test_results_at_the_cap_are_not_truncated() -> None:
    def exact() -> str:
        """Exactly the cap."""
        return "x" * 100

    executed = await run_one([make_tool(exact)], call("exact"), max_result_chars=100)
    assert not executed.result.truncated and executed.result.content == "x" * 100
    assert executed.full_content is None and executed.result.size == 100
