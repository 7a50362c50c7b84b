"""Hooks (keel/hooks.py, ADR 0052): each kind changing a run, recorded, not called again on
resume for a step already taken; failing hooks classified; the synthesis rule untouchable."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import keel
from keel.records import (
    HookApplied,
    ModelRequestSent,
    ModelResponseReceived,
    ToolResultRecorded,
)
from keel.store import RunStore

RAN: list[dict[str, Any]] = []


@keel.tool
def lookup(topic: str) -> str:
    """Look a topic up."""
    RAN.append({"topic": topic})
    return f"{topic}: write to ana@example.com or bo@example.org"


@keel.tool(effect="side_effecting", requires_approval=True)
def publish(text: str) -> str:
    """Publish text."""
    RAN.append({"text": text})
    return f"published {text}"


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


def agent(
    turns: list[dict[str, Any]], hooks: list[object], store: RunStore | None = None, **limits: Any
) -> keel.Agent:
    transport = keel.ScriptedTransport.from_dict(
        {"turns": turns, "on_synthesis": {"text": "synthesized"}}, record=True
    )
    return keel.Agent(
        transport,
        tools=[lookup, publish],
        store=store or keel.Store(":memory:"),
        limits=keel.Limits(**limits),
        hooks=hooks,
        hook_timeout=0.5,
    )


def events(a: keel.Agent, run_id: str, kind: type[Any]) -> list[Any]:
    return [e for e in a.store.events(run_id) if isinstance(e, kind)]


def requests(a: keel.Agent) -> list[keel.ModelRequest]:
    transport = a.transport
    assert isinstance(transport, keel.ScriptedTransport)
    return transport.requests


@pytest.fixture(autouse=True)
def _ran() -> None:
    RAN.clear()


class Counting:
    def __init__(self) -> None:
        self.seen: dict[str, int] = {}

    def count(self, point: str) -> None:
        self.seen[point] = self.seen.get(point, 0) + 1


# -- each kind changes the run, recorded ---------------------------------------------------------


def test_a_before_model_call_hook_replaces_the_request_and_is_recorded() -> None:
    class Brief:
        def before_model_call(self, request: keel.ModelRequest) -> keel.Replace:
            return keel.Replace(replace(request, system=request.system + "\nBe brief."))

    a = agent([{"text": "ok"}], [Brief()])
    done = a.run("q")
    assert done.status == "completed"
    assert requests(a)[0].system.endswith("Be brief.")
    (applied,) = events(a, done.run_id, HookApplied)
    assert (applied.hook, applied.point) == ("Brief", "before_model_call")
    assert applied.action == "replace"


def test_an_after_model_call_hook_replaces_the_response_and_the_record_holds_it() -> None:
    class Narrow:
        async def after_model_call(self, response: keel.ModelResponse) -> keel.Replace | None:
            if not response.tool_calls:
                return None
            calls = tuple(
                keel.ToolCall.from_arguments(c.id, c.name, {"topic": "safe"})
                for c in response.tool_calls
            )
            return keel.Replace(replace(response, tool_calls=calls))

    a = agent([call("lookup", topic="secret"), {"text": "ok"}], [Narrow()])
    done = a.run("q")
    assert RAN == [{"topic": "safe"}]
    first = events(a, done.run_id, ModelResponseReceived)[0]
    assert [c.arguments for c in first.tool_calls] == ['{"topic":"safe"}']
    assert first.tool_calls[0].id == "k1_0"
    (applied,) = events(a, done.run_id, HookApplied)
    assert applied.point == "after_model_call" and applied.detail["calls_before"] == [
        'lookup {"topic":"secret"}'
    ]


def test_a_before_tool_call_hook_replaces_arguments_and_the_counters_count_what_ran() -> None:
    class Fix:
        def before_tool_call(self, call: keel.ToolCall) -> keel.Replace | None:
            if call.arguments.get("topic") == "typo":
                return keel.Replace({"topic": "fixed"})
            return None

    a = agent([call("lookup", topic="typo"), {"text": "ok"}], [Fix()])
    done = a.run("q")
    assert RAN == [{"topic": "fixed"}]
    (result,) = events(a, done.run_id, ToolResultRecorded)
    assert result.call_key == 'lookup {"topic":"fixed"}'
    counts = {k: c.count for k, c in a.store.counters(done.run_id).items()}
    assert counts.get('lookup {"topic":"typo"}', 0) == 0 and counts['lookup {"topic":"fixed"}'] == 1
    (applied,) = events(a, done.run_id, HookApplied)
    assert (applied.action, applied.call_id, applied.detail) == ("replace", "k1_0",
                                                                 {"topic": "fixed"})  # fmt: skip


def test_a_before_tool_call_deny_is_a_denial_by_the_hooks_class_name() -> None:
    class Policy:
        def before_tool_call(self, call: keel.ToolCall) -> keel.Deny:
            return keel.Deny("lookups are closed today")

    a = agent([call("lookup", topic="x"), {"text": "ok"}], [Policy()])
    done = a.run("q")
    assert done.status == "completed" and RAN == [] and done.tool_calls == 0
    (result,) = events(a, done.run_id, ToolResultRecorded)
    assert result.is_error
    assert result.content.startswith("Denied by Policy: lookups are closed today.")


def test_an_after_tool_call_hook_replaces_the_result_and_the_whole_text_is_not_kept() -> None:
    import re

    class Redact:
        def after_tool_call(self, call: keel.ToolCall, result: keel.ToolResult) -> keel.Replace:
            return keel.Replace(re.sub(r"\S+@\S+", "[e-mail]", result.content))

    a = agent([call("lookup", topic="team"), {"text": "ok"}], [Redact()], max_result_chars=100)
    done = a.run("q")
    (result,) = events(a, done.run_id, ToolResultRecorded)
    assert "@" not in result.content and "[e-mail]" in result.content
    sent = requests(a)[-1].items[-1]
    assert isinstance(sent, keel.ToolResult) and "@" not in sent.content
    assert a.store.blob(result.digest) is None
    (applied,) = events(a, done.run_id, HookApplied)
    assert applied.point == "after_tool_call" and applied.call_id == "k1_0"


# -- not called again on resume for a step already taken ------------------------------------------


def test_hooks_are_not_called_again_on_resume_for_a_replayed_step(tmp_path: Path) -> None:
    class Recorded(Counting):
        def after_model_call(self, response: keel.ModelResponse) -> None:
            self.count("after_model_call")

        def before_tool_call(self, call: keel.ToolCall) -> keel.Replace | None:
            self.count("before_tool_call")
            if call.name == "publish":
                return keel.Replace({"text": "reviewed"})
            return None

        def after_tool_call(self, call: keel.ToolCall, result: keel.ToolResult) -> None:
            self.count("after_tool_call")

    turns = [
        {
            "tool_calls": [
                {"name": "lookup", "arguments": {"topic": "a"}},
                {"name": "publish", "arguments": {"text": "draft"}},
            ]
        },
        {"text": "ok"},
    ]
    store = keel.Store(tmp_path / "runs.sqlite")
    first = Recorded()
    a = agent(turns, [first], store)
    paused = a.run("q")
    assert paused.status == "awaiting_approval"
    (pending,) = paused.pending_approvals
    assert pending.arguments == {"text": "reviewed"}  # the person sees what the hook made
    assert first.seen == {"after_model_call": 1, "before_tool_call": 2}
    a.approve(paused.run_id, pending.call_id)
    again = Recorded()
    b = agent(turns, [again], store)
    b.transport.restore(store.get_run(paused.run_id).state.transport)  # type: ignore[union-attr,attr-defined]
    done = b.resume(paused.run_id)
    assert done.status == "completed"
    assert RAN == [{"topic": "a"}, {"text": "reviewed"}]
    # the first turn and its calls met the hooks already: only the new turn and the two
    # results, which came back in this process, meet them now
    assert again.seen == {"after_model_call": 1, "after_tool_call": 2}


# -- failures ------------------------------------------------------------------------------------


def test_a_raising_hook_is_a_classified_failure() -> None:
    class Broken:
        def before_tool_call(self, call: keel.ToolCall) -> None:
            raise RuntimeError("policy service down")

    a = agent([call("lookup", topic="x"), {"text": "ok"}], [Broken()])
    done = a.run("q")
    assert done.status == "failed" and done.failure is not None
    assert done.failure.kind == "HookFailed"
    said = "Broken.before_tool_call raised RuntimeError: policy service down"
    assert said in done.failure.message
    assert RAN == []


def test_a_hanging_or_nonsense_hook_is_a_classified_failure() -> None:
    release = threading.Event()

    class Hangs:
        def before_model_call(self, request: keel.ModelRequest) -> None:
            release.wait(5)

    class Slow:
        async def after_model_call(self, response: keel.ModelResponse) -> None:
            await asyncio.sleep(5)

    class Nonsense:
        def before_model_call(self, request: keel.ModelRequest) -> str:
            return "yes"

    try:
        for hook, said in ((Hangs(), "did not return within 0.5s"),
                           (Slow(), "did not return within 0.5s"),
                           (Nonsense(), "returned str")):  # fmt: skip
            done = agent([{"text": "ok"}], [hook]).run("q")
            assert done.failure is not None and done.failure.kind == "HookFailed"
            assert said in done.failure.message
    finally:
        release.set()


def test_an_end_run_hook_ends_the_run_classified() -> None:
    class Stop:
        def after_tool_call(self, call: keel.ToolCall, result: keel.ToolResult) -> keel.EndRun:
            return keel.EndRun("the result names a customer")

    a = agent([call("lookup", topic="x"), {"text": "ok"}], [Stop()])
    done = a.run("q")
    assert done.failure is not None and done.failure.kind == "EndedByHook"
    assert "the result names a customer" in done.failure.message
    (applied,) = events(a, done.run_id, HookApplied)
    assert applied.action == "end_run"


# -- the synthesis rule --------------------------------------------------------------------------


def test_a_hook_that_asks_for_tools_in_a_synthesis_turn_is_refused() -> None:
    class Greedy:
        def before_model_call(self, request: keel.ModelRequest) -> keel.Replace:
            return keel.Replace(replace(request, tool_choice="required"))

        def after_model_call(self, response: keel.ModelResponse) -> keel.Replace:
            more = keel.ToolCall.from_arguments("x", "lookup", {"topic": "more"})
            return keel.Replace(replace(response, tool_calls=(more,)))

    turns = [call("lookup", topic="a"), call("lookup", topic="a"), {"text": "never"}]
    a = agent(turns, [Greedy()], loop_threshold=3)
    done = a.run("q")
    assert done.status == "completed" and done.synthesized == "repeated_tool"
    assert done.answer == "synthesized"
    sent = events(a, done.run_id, ModelRequestSent)
    assert sent[-1].synthesis is not None and sent[-1].tool_choice == "none"
    assert requests(a)[-1].tool_choice == "none"
    refused = [e for e in events(a, done.run_id, HookApplied) if e.action == "refused"]
    assert [e.point for e in refused] == ["before_model_call", "after_model_call"]
    assert RAN == [{"topic": "more"}, {"topic": "more"}]  # normal turns: the hook may


def test_the_guardrail_example_refuses_fetch_outside_its_list_and_redacts_e_mails() -> None:
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL")}
    env["PYTHONPATH"] = str(root / "src")
    done = subprocess.run(
        [sys.executable, str(root / "examples" / "guardrails.py")],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1:] == [
        "hook: FetchAllowList before_tool_call deny",
        "hook: RedactEmails after_tool_call replace",
    ]
    assert "@" not in done.stdout


# -- hooks bounded like tools (issue 46) ----------------------------------------------------------


def _ends(work: Any, within: float = 60.0) -> Any:
    """`work()` on a daemon thread; its value, or the test fails if it has not returned."""
    box: list[Any] = []
    thread = threading.Thread(target=lambda: box.append(work()), daemon=True)
    thread.start()
    thread.join(within)
    if thread.is_alive():
        pytest.fail(f"agent.run() had not returned after {within:g}s")
    return box[0]


def test_hk02_a_hanging_sync_hook_is_abandoned_at_its_timeout() -> None:
    """HK-02: the run failed HookFailed at hook_timeout, but agent.run() returned only when the
    hook did (the loop's default executor is joined at exit). Now the hook's daemon thread is
    abandoned: agent.run() returns long before the hook would."""
    release = threading.Event()

    class Hangs:
        def before_tool_call(self, call: keel.ToolCall) -> None:
            release.wait(600)

    try:
        started = time.monotonic()
        done = _ends(lambda: agent([call("lookup", topic="x"), {"text": "ok"}], [Hangs()]).run("q"))
        assert time.monotonic() - started < 60
        assert done.failure is not None and done.failure.kind == "HookFailed"
        assert "did not return within 0.5s" in done.failure.message
    finally:
        release.set()


def test_hk03_an_async_hook_that_ignores_cancellation_is_abandoned() -> None:
    """HK-03: an async hook that swallows its cancellation hung the run for good."""

    class Stubborn:
        async def after_model_call(self, response: keel.ModelResponse) -> None:
            while True:
                try:
                    await asyncio.sleep(10)
                except asyncio.CancelledError:
                    continue

    done = _ends(lambda: agent([{"text": "ok"}], [Stubborn()]).run("q"))
    assert done.failure is not None and done.failure.kind == "HookFailed"
    assert "did not return within 0.5s" in done.failure.message


@pytest.mark.parametrize(
    "error", [KeyboardInterrupt, SystemExit, GeneratorExit, asyncio.CancelledError]
)
@pytest.mark.parametrize("sync", [True, False])
def test_hk01_a_hook_raising_a_base_exception_is_a_recorded_hook_failure(
    error: type[BaseException], sync: bool
) -> None:
    """HK-01: a hook raising KeyboardInterrupt, SystemExit, GeneratorExit or CancelledError
    escaped agent.run and left the run `running`. Now it is HookFailed, recorded."""

    class SyncRaises:
        def before_model_call(self, request: keel.ModelRequest) -> None:
            raise error("from the hook")

    class AsyncRaises:
        async def before_model_call(self, request: keel.ModelRequest) -> None:
            raise error("from the hook")

    a = agent([{"text": "ok"}], [SyncRaises() if sync else AsyncRaises()])
    done = _ends(lambda: a.run("q"))
    assert done.failure is not None and done.failure.kind == "HookFailed"
    assert error.__name__ in done.failure.message
    (record,) = a.store.list_runs()
    assert record.status == "failed"


class _NotJson:
    pass


@pytest.mark.parametrize(
    "hook_point, outcome, said",
    [
        ("before_tool_call", keel.Replace({"topic": _NotJson()}), "not JSON"),
        ("before_tool_call", keel.Replace({"topic": float("nan")}), "not JSON"),
        ("after_tool_call", keel.Replace(b"bytes"), "text"),
        ("after_model_call", keel.Replace(keel.ModelResponse(text=5)), "text"),  # type: ignore[arg-type]
    ],
)
def test_hk04_a_hook_returning_what_is_not_json_or_text_is_a_hook_failure(
    hook_point: str, outcome: Any, said: str
) -> None:
    """HK-04: a hook returning a value that is not JSON escaped as an exception."""
    hook = type("Odd", (), {hook_point: lambda self, *args: outcome})()
    a = agent([call("lookup", topic="x"), {"text": "ok"}], [hook])
    done = _ends(lambda: a.run("q"))
    assert done.failure is not None and done.failure.kind == "HookFailed", done.failure
    assert said in done.failure.message
    (record,) = a.store.list_runs()
    assert record.status == "failed"


@pytest.mark.parametrize("outcome", [keel.Deny(7), keel.EndRun(["a list"])])  # type: ignore[arg-type]
def test_hk05_a_deny_or_end_run_whose_reason_is_not_text_is_a_hook_failure(outcome: Any) -> None:
    """HK-05: a Deny or EndRun whose reason was not text was reported as a store failure."""

    class Odd:
        def before_tool_call(self, call: keel.ToolCall) -> Any:
            return outcome

    a = agent([call("lookup", topic="x"), {"text": "ok"}], [Odd()])
    done = _ends(lambda: a.run("q"))
    assert done.failure is not None and done.failure.kind == "HookFailed", done.failure
    assert "reason" in done.failure.message and "text" in done.failure.message


@pytest.mark.parametrize(
    "hook_point, outcome",
    [
        ("after_model_call", keel.Replace(keel.ModelResponse(text="bad \ud800 answer"))),
        ("before_tool_call", keel.Replace({"topic": "x\udfff"})),
        ("after_tool_call", keel.Replace("a result \ud800")),
        ("before_tool_call", keel.Deny("no \ud800")),
    ],
)
def test_hk06_a_lone_surrogate_a_hook_brings_in_is_cleaned_where_it_enters(
    hook_point: str, outcome: Any
) -> None:
    """HK-06: a hook's replaced text could bring in a lone surrogate that inbound cleaning
    (keel/inbound.py) never saw; the store could not hold it. Now it is U+FFFD, as a model's."""
    hook = type("Odd", (), {hook_point: lambda self, *args: outcome})()
    a = agent([call("lookup", topic="x"), {"text": "ok"}], [hook])
    done = _ends(lambda: a.run("q"))
    assert done.failure is None or done.failure.kind != "StoreUnavailable", done.failure
    assert done.status == "completed", done.failure
    stored = repr(a.store.events(done.run_id)) + repr(done.answer)
    assert "\\ud800" not in stored and "\\udfff" not in stored
