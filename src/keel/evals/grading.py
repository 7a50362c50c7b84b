"""Grading a run's answer: right, wrong or cut off, and the checks that decide it.

With a real model the figure that matters is not whether a rule held but whether the answer
was right. A run is graded

- "cut off" when a limit cut it short: its answer stopped at the output limit, the run
  failed, or it had to be cancelled. An answer written in a synthesis turn (budget, deadline,
  repetition) that ends on its own is graded on what it says like any other: that turn is how
  the runtime gets the best supported answer, and the table counts those runs beside the grades;
- "wrong" when it ended on its own but its answer misses what the question requires, names
  something the repository does not hold, or repeats a synthesis control's sentence (a small
  model echoed Keel's instruction instead of answering, issue 26);
- "right" otherwise.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from keel._run import CONTROLS
from keel.evals.facts import Expected, invented, missing
from keel.result import RunResult

__all__ = ["GRADES", "Grade", "echoed_controls", "grade", "repo_problems"]

Grade = Literal["right", "wrong", "cut off"]
GRADES: tuple[Grade, ...] = ("right", "wrong", "cut off")
_ECHO_WORDS = 8
"""A run of this many words of a control, in order, in an answer is an echo of it."""


def grade(result: RunResult, stuck: bool, problems: list[str]) -> Grade:
    if stuck or result.status != "completed" or result.cut_off:
        return "cut off"
    return "wrong" if problems else "right"


def repo_problems(expected: Expected, answer: str, repo: Path) -> list[str]:
    """Why an answer to a repo question is wrong: what it misses, what it invents."""
    problems: list[str] = []
    if lacking := missing(expected, answer):
        problems.append(f"answer does not name {', '.join(lacking)}")
    if false := invented(expected, answer, repo):
        problems.append(f"answer names what the repository does not hold: {', '.join(false)}")
    return problems


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.casefold())


def echoed_controls(answer: str | None) -> list[str]:
    """The synthesis controls' sentences (or runs of eight of their words) the answer holds."""
    if not answer:
        return []
    said = " " + " ".join(_words(answer)) + " "
    echoed: list[str] = []
    for control in CONTROLS:
        for sentence in re.split(r"(?<=[.!?])\s+", control):
            words = _words(sentence)
            runs = (
                [words]
                if len(words) <= _ECHO_WORDS
                else [words[i : i + _ECHO_WORDS] for i in range(len(words) - _ECHO_WORDS + 1)]
            )
            if words and any(f" {' '.join(run)} " in said for run in runs):
                echoed.append(sentence)
    return echoed
