"""Input from outside that must not hang, drive or double a run, round 3 (issue 46, ADR 0062).

Each test is named after the probe row it answers (EV-01, MC-01, ...) and reproduces what broke
first. Bounds on time are generous (the machine is shared): they tell a run that ends from one
that hangs, never a fast run from a slow one.
"""

from __future__ import annotations

import time
from typing import Any

from keel.transports.local.qwen_format import read_output
from keel.transports.text_calls import read_text_calls


def _took(fn: Any) -> float:
    started = time.monotonic()
    fn()
    return time.monotonic() - started


# -- EV-01: every check over model text is linear ---------------------------------------------


def test_ev01_the_pseudo_call_readers_are_linear_in_the_answer() -> None:
    """A `<tool_call>` block with a long run of white space inside, and 100,000 pseudo-calls
    in a row: each read ends (the lazy regex and the slice per call took minutes)."""
    tools = {"read_file"}
    answers = [
        "<tool_call>x" + " " * 200_000 + "x",
        "functions.read_file:{} " * 100_000,
        '{"name":"read_file","arguments":{}} ' * 100_000,
    ]
    for answer in answers:
        assert _took(lambda a=answer: read_text_calls(a, tools)) < 20, answer[:20]
    qwen = "<tool_call>x" + " " * 200_000 + "x"
    assert _took(lambda: read_output(qwen, "auto", lambda: "local_1")) < 20


def test_ev01_tool_call_blocks_are_cut_as_the_regex_cut_them() -> None:
    found = read_text_calls(
        '<tool_call> {"name": "read_file", "arguments": {"path": "a"}}\n</tool_call>\n'
        '<tool_call>{"name": "read_file", "arguments": {"path": "b"}}',
        {"read_file"},
    )
    assert found is not None and found.problem is None
    assert found.calls == (("read_file", '{"path": "a"}'), ("read_file", '{"path": "b"}'))
