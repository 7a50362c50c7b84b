"""A run that insists on evidence first: `Limits.first_turn_tool` (``keel run --first-turn-tool``,
``[limits] first_turn_tool = true`` in a scenario) sends the first turn with tool_choice
"required". The rule lives in `keel._run.synthesis.decide_mode`; synthesis always wins over it.
Real file tools over a temporary folder; the model is scripted and records what it was sent."""

from __future__ import annotations

from pathlib import Path

import pytest

import keel
from keel._run.synthesis import FIRST_CALL_CONTROL, NORMAL, TOOL_REQUIRED, decide_mode
from keel.records import ModelRequestSent
from support import call, run_script

ANSWER = {"text": "The loop imports the breaker."}


@pytest.fixture
def files(tmp_path: Path) -> list[keel.Tool]:
    (tmp_path / "loop.py").write_text("from keel._run.breaker import IdenticalCallBreaker\n")
    return keel.file_tools(tmp_path)


def test_the_mode_rule_synthesis_then_required_then_normal() -> None:
    assert decide_mode(None, None) is NORMAL
    assert decide_mode(None, None, insist_on_tool=True) is TOOL_REQUIRED
    assert TOOL_REQUIRED.tool_choice == "required"
    assert NORMAL.tool_choice is None
    repeated = decide_mode("read_file:{}", None, insist_on_tool=True)
    budget = decide_mode(None, "model_calls", insist_on_tool=True)
    assert (repeated.reason, repeated.tool_choice) == ("repeated_tool", "none")
    assert (budget.reason, budget.tool_choice) == ("budget", "none")


async def test_the_first_turn_requires_a_tool_when_the_run_asks(files: list[keel.Tool]) -> None:
    script = {"turns": [call("read_file", path="loop.py"), ANSWER]}
    out = await run_script(script, files, first_turn_tool=True)
    assert out.result.status == "completed"
    assert [r.tool_choice for r in out.requests] == ["required", None]
    sent = out.of_type(ModelRequestSent)
    assert [e.tool_choice for e in sent] == ["required", None]  # recorded, shown by keel show


async def test_without_the_option_no_turn_requires_a_tool(files: list[keel.Tool]) -> None:
    out = await run_script({"turns": [call("read_file", path="loop.py"), ANSWER]}, files)
    assert [r.tool_choice for r in out.requests] == [None, None]


async def test_a_retried_first_turn_still_requires_a_tool(files: list[keel.Tool]) -> None:
    script = {
        "turns": [{"error": {"status": 503}}, call("read_file", path="loop.py"), ANSWER],
    }
    out = await run_script(script, files, first_turn_tool=True)
    assert [r.tool_choice for r in out.requests] == ["required", "required", None]


async def test_synthesis_turns_win_over_a_required_first_turn(files: list[keel.Tool]) -> None:
    """One model call in the budget: that call is budget synthesis, even on the first turn."""
    script = {"turns": [], "on_synthesis": ANSWER}
    out = await run_script(script, files, first_turn_tool=True, max_model_calls=1)
    assert out.result.synthesized == "budget"
    assert [r.tool_choice for r in out.requests] == ["none"]


async def test_a_run_without_tools_is_never_asked_for_a_tool() -> None:
    out = await run_script({"turns": [ANSWER]}, [], first_turn_tool=True)
    assert out.result.status == "completed"
    assert [r.tool_choice for r in out.requests] == [None]


async def test_an_answer_to_a_required_turn_still_ends_the_run(files: list[keel.Tool]) -> None:
    """A provider that answers anyway (the XML fallback cannot force a call) is not an error:
    the run completes with that answer, as any answer in a normal turn."""
    out = await run_script({"turns": [ANSWER]}, files, first_turn_tool=True)
    assert out.result.status == "completed"
    assert out.result.answer == ANSWER["text"]
    assert out.result.synthesized is None


def test_a_scenario_can_insist_on_a_first_tool_call() -> None:
    """``[limits] first_turn_tool = true``: every built-in scenario sets it, so a real model
    (``keel eval --model``) looks before it answers; scripted models ignore tool_choice."""
    from keel.evals.loading import builtin_names, resolve

    scenarios = resolve(list(builtin_names()))
    assert scenarios and all(s.limits.first_turn_tool for s in scenarios)


async def test_a_required_first_turn_says_which_tool_to_start_with(
    files: list[keel.Tool],
) -> None:
    """The local model's required first call went to list_files with a made-up path
    ("/path/to/repository", four times) instead of reading the file the question named: the
    first turn now carries a control saying what to start with; later turns carry none."""
    script = {"turns": [call("read_file", path="loop.py"), ANSWER]}
    out = await run_script(script, files, first_turn_tool=True)
    (control,) = out.requests[0].volatile  # a transport that steers names the call after it
    assert control.startswith(FIRST_CALL_CONTROL)
    assert "path exactly as the question writes it" in FIRST_CALL_CONTROL
    assert out.requests[1].volatile == ()
