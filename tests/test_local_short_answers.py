"""The local model's answers stay short and do not repeat themselves (issue 25): its
synthesized answer repeated "The `run` method in `keel/loop.py` is missing the `run` method"
until the output limit cut it at 512 tokens. `NoRepeats` (behind the grammar mask) forbids
writing any run of ten tokens twice; a synthesis turn's grammar allows at most thirty lines."""

from __future__ import annotations

import numpy as np

from keel.messages import ModelRequest, UserMessage
from keel.transports.local import LocalTransport
from keel.transports.local.answers import MAX_LINES, NGRAM, SHORT_ANSWER_RULE, NoRepeats
from keel.transports.local.grammar import ANSWER_RULE, turn_grammar

VOCAB = 50
PROMPT = [7, 7, 7]


def greedy(processor: NoRepeats, wants: list[int], steps: int) -> list[int]:
    """Sample greedily from scores that always prefer the next token of `wants` (cyclic), as a
    model stuck in a loop does; what the processor leaves decides."""
    ids = list(PROMPT)
    for step in range(steps):
        scores = np.zeros(VOCAB, dtype=np.single)
        scores[wants[step % len(wants)]] = 10.0
        scores[VOCAB - 1] = 5.0  # the end of turn: the model's second choice
        ids.append(int(np.argmax(processor(np.array(ids), scores))))
    return ids[len(PROMPT) :]


def test_no_run_of_ten_tokens_is_written_twice() -> None:
    sentence = list(range(1, 13))  # twelve tokens, said again and again
    out = greedy(NoRepeats(len(PROMPT), lambda t: False), sentence, 40)
    assert out[:12] == sentence
    assert out[12 : 12 + NGRAM - 1] == sentence[: NGRAM - 1]
    assert out[12 + NGRAM - 1] == VOCAB - 1  # the tenth token of the repeat: not allowed


def test_shorter_repeats_are_allowed() -> None:
    """"from keel._run." opens every import line: six tokens, repeated, is no loop."""
    line = [1, 2, 3, 4, 5, 6]
    lines = [*line, 20, *line, 21, *line, 22, *line, 23]
    out = greedy(NoRepeats(len(PROMPT), lambda t: False), lines, len(lines))
    assert out == lines


def test_a_call_is_never_touched() -> None:
    sentence = list(range(1, 13))
    out = greedy(NoRepeats(len(PROMPT), lambda t: t == 1), sentence, 30)
    assert out == (sentence * 3)[:30]


def test_the_only_allowed_token_stays_allowed() -> None:
    """Behind the grammar mask: when the repeat is all the grammar allows, it is kept."""
    processor = NoRepeats(0, lambda t: False, n=2)
    ids = [3, 4, 3]
    scores = np.full(VOCAB, -np.inf, dtype=np.single)
    scores[4] = 1.0
    assert processor(np.array(ids), scores.copy())[4] == 1.0


def test_a_synthesis_turns_answer_has_at_most_thirty_lines() -> None:
    grammar = turn_grammar((), "none", None, SHORT_ANSWER_RULE)
    assert f"{{0,{MAX_LINES - 1}}}" in grammar and MAX_LINES == 30
    assert turn_grammar((), "none") == turn_grammar((), "none", None, ANSWER_RULE)


async def test_the_local_models_answer_does_not_loop_on_one_line(
    local_transport: LocalTransport,
) -> None:
    """On the real model: asked for "7" a hundred times, it wrote `7,` ten times before (its
    own stop); with runs of ten tokens written once, the sixth `7,` is not allowed."""
    request = ModelRequest(
        "You follow instructions exactly.",
        (),
        (UserMessage("List the number 7 one hundred times, separated by commas."),),
        tool_choice="none",
    )
    response = await local_transport.request(request)
    assert response.text is not None
    assert response.text.count("7") <= 6, response.text
