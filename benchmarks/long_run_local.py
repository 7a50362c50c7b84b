"""The embedded 1.5B model with a 4,096-token window on questions whose reading exceeds it
(issue 44): each run must end with an answer (or a classified failure), never with the model's
"exceed context window" error. Prints one row per question: how it ended, the time, the calls,
and what the window did (results elided and clamped, read-backs, context synthesis turns).

    .venv/bin/python benchmarks/long_run_local.py [--n-ctx 4096] [--repo .]

Needs the `local-1-5b` extra (make run installs it). Takes minutes on two cores.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import keel
from keel.records import ModelRequestSent, ResultClamped, ResultElided, ToolCallRequested
from keel.transports.local import LocalTransport

QUESTIONS = (
    "Read src/keel/agent.py part by part, from its first line to its last, and list every "
    "method of the class Agent.",
    "Which modules does src/keel/agent.py import?",
    "What does the module docstring of src/keel/_run/context.py say happens over the budget?",
    "Which classes does src/keel/records.py define?",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-ctx", type=int, default=4096)
    parser.add_argument("--repo", type=Path, default=Path("."))
    parser.add_argument("--max-model-calls", type=int, default=12)
    parser.add_argument("--question", action="append", help="instead of the built-in ones")
    args = parser.parse_args()
    model = LocalTransport(model="1.5b", n_ctx=args.n_ctx)
    store = keel.Store(":memory:")
    limits = keel.Limits(max_model_calls=args.max_model_calls, first_turn_tool=True)
    agent = keel.Agent(model, tools=keel.file_tools(args.repo), limits=limits, store=store)
    print(f"1.5B, n_ctx {args.n_ctx}, at most {args.max_model_calls} model calls\n")
    print("| question | ended | s | model calls | largest request | elided | clamped | "
          "read_result | context synthesis |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for question in args.question or QUESTIONS:
        started = time.monotonic()
        result = agent.run(question)
        took = time.monotonic() - started
        events = store.events(result.run_id)
        sizes = [e.estimated_input_tokens for e in events if isinstance(e, ModelRequestSent)]
        reads = [e for e in events if isinstance(e, ToolCallRequested) and e.name == "read_result"]
        ended = result.status if result.failure is None else f"failed {result.failure.kind}"
        if result.synthesized:
            ended += f" ({result.synthesized})"
        print(
            f"| {question} | {ended} | {took:.0f} | {result.model_calls} | {max(sizes, default=0)} "
            f"| {sum(isinstance(e, ResultElided) for e in events)} "
            f"| {sum(isinstance(e, ResultClamped) for e in events)} | {len(reads)} "
            f"| {'yes' if result.synthesized == 'context' else 'no'} |"
        )
        answer = " ".join((result.answer or "").split())
        print(f"|   answer: {answer[:300]} |||||||||")


if __name__ == "__main__":
    main()
