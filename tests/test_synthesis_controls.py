"""Synthesis controls a small model does not echo (issue 26, ADR 0036): the local model's
synthesized answers repeated Keel's instruction ("Research stopped because it was repeating
the same tool request, so no tools are available for this reply") in 6 runs of 6. A control
is now imperatives about the answer only: no sentence stating Keel's own state, none asking
the model to state it."""

from __future__ import annotations

import re

import pytest

from keel._run.synthesis import BUDGET_CONTROL, REPEATED_TOOL_CONTROL

CONTROLS = {"repeated_tool": REPEATED_TOOL_CONTROL, "budget": BUDGET_CONTROL}
IMPERATIVE = ("Answer ", "Name ", "Do not ", "Use ", "Leave ")
MEANT_TO_BE_SAID = re.compile(
    r"\b(say|says|state|mention|explain|tell|report|write that|note that)\b", re.I
)
ABOUT_KEEL = re.compile(r"\b(research|stopped|repeating|budget|spent|available|tools are)\b", re.I)


def sentences(text: str) -> list[str]:
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if s.strip()]


@pytest.mark.parametrize("reason", sorted(CONTROLS))
def test_the_control_text_carries_no_sentence_meant_to_be_copied(reason: str) -> None:
    control = CONTROLS[reason]
    for sentence in sentences(control):
        assert sentence.startswith(IMPERATIVE), (reason, sentence)  # an order, not a statement
        assert not MEANT_TO_BE_SAID.search(sentence), (reason, sentence)
        assert not ABOUT_KEEL.search(sentence), (reason, sentence)  # nothing to echo about Keel


def test_the_old_echoed_sentence_is_gone() -> None:
    echoed = "Research stopped because it was repeating the same tool request"
    for control in CONTROLS.values():
        assert "research" not in control.lower() and echoed.lower() not in control.lower()


def test_every_built_in_synthesis_scenario_fails_an_answer_that_echoes_the_control() -> None:
    """`keel eval --model local` measures the echo: a synthesized answer holding any sentence
    of the control fails its scenario (`answer_excludes`)."""
    from keel.evals.loading import builtin_names, resolve

    synthesizing = [s for s in resolve(builtin_names()) if s.spec.expect.synthesized]
    assert len(synthesizing) >= 5
    for scenario in synthesizing:
        excluded = scenario.spec.expect.answer_excludes
        assert excluded, scenario.name
        for phrase in excluded:
            assert any(phrase in c.casefold() for c in CONTROLS.values()), (scenario.name, phrase)
        for control in CONTROLS.values():
            for sentence in sentences(control):
                assert any(p in sentence.casefold() for p in excluded), (scenario.name, sentence)
