"""A scripted provider that refuses turns as longer than its window, in each wire's own words.

A long-run scenario's `[refusals]` table names the wordings, one refusal each, a seed, and the
first turn that may be refused: the refusals are put before turns of the script from that one
on, picked at random with the seed, so a run is the same every time and no turn is refused
twice (a second refusal of one turn makes it a context synthesis turn, ADR 0060, which is not
what these refusals test). A refused attempt consumes
its error turn; the shrunk retry gets the turn that was refused. The words are the providers'
own (keel/transports/overflow.py recognises them, ADR 0056), with the scenario's window as the
limit they name and a request a little over it:

    [refusals]
    wordings = ["openai", "anthropic", "llama.cpp"]
    seed = 44
    after = 1        # not the first request: the question alone

Pure: a script in, a script out.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, Literal

__all__ = ["WIRES", "Wire", "refusal", "refused_turns", "with_refusals"]

Wire = Literal["openai", "anthropic", "llama.cpp"]
WIRES: tuple[Wire, ...] = ("openai", "anthropic", "llama.cpp")

OVER = 1.1
"""The request a refusal names, as a share of the window it names."""


def refusal(wire: Wire, window: int) -> dict[str, Any]:
    """An error turn in `wire`'s words: a 400 naming `window` (and a request over it, where the
    wire says one)."""
    requested = int(window * OVER)
    if wire == "openai":
        message = (
            f"This model's maximum context length is {window} tokens. However, your messages "
            f"resulted in {requested} tokens. Please reduce the length of the messages."
        )
    elif wire == "anthropic":
        message = f"prompt is too long: {requested} tokens > {window} maximum"
    else:
        message = "the request exceeds the available context size, try increasing it"
    return {"error": {"status": 400, "message": message}}


def refused_turns(turns: int, count: int, seed: int, after: int = 0) -> list[int]:
    """Which turns (0-based, in order) are refused: `count` distinct ones of the `turns` from
    turn `after` on, picked with `seed`."""
    if count > turns - after:
        raise ValueError(
            f"{count} refusals need {count} turns from turn {after} on; the script has {turns}"
        )
    return sorted(random.Random(seed).sample(range(after, turns), count))


def with_refusals(
    script: dict[str, Any], wordings: Sequence[Wire], seed: int, window: int, after: int = 0
) -> dict[str, Any]:
    """`script` with one refusal per wording (in order) before turns picked with `seed` from
    turn `after` on."""
    turns = list(script.get("turns", []))
    picked = refused_turns(len(turns), len(wordings), seed, after)
    before = dict(zip(picked, wordings, strict=True))
    out: list[Any] = []
    for index, turn in enumerate(turns):
        if index in before:
            out.append(refusal(before[index], window))
        out.append(turn)
    return {**script, "turns": out}
