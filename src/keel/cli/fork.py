"""`keel fork RUN --at STEP` and `keel fork --recording FILE --id ID --at TURN` (ADR 0051): a new
run whose first steps are copied from a stored run or a recording, the rest live with every
`keel run` option; and how `keel show` presents a fork.

Without `--model`, a fork of a stored run goes on with the model the run was started with (a
fork to try another limit, loop policy or instruction keeps the model); a fork of a recording
takes the model as `keel run` chooses it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from keel.cli.common import EXIT_CODES, err, guard, json_errors, usage_error
from keel.cli.finish import announce, finish
from keel.cli.flags import command_agent, with_agent_options
from keel.cli.signals import stoppable

if TYPE_CHECKING:
    from keel._run import ForkPrefix
    from keel.agent import Agent
    from keel.store import RunRecord

__all__ = ["fork", "forked_json", "forked_line"]


@json_errors
@stoppable(EXIT_CODES, err)
@with_agent_options()
def fork(
    run_id: Annotated[
        str | None,
        typer.Argument(metavar="RUN", help="The stored run to fork (or --recording)."),
    ] = None,
    at: Annotated[
        int | None,
        typer.Option(
            "--at",
            help="The last step copied, as `keel show` numbers steps (a recording: its turn).",
        ),
    ] = None,
    recording: Annotated[
        Path | None,
        typer.Option(
            "--recording",
            help="Fork a run another runtime recorded: a trajectories file (the shared format) "
            "or an OpenAI chat message list.",
        ),
    ] = None,
    recording_id: Annotated[
        str | None,
        typer.Option("--id", help="The recording's id in FILE (not needed when it holds one)."),
    ] = None,
    question: Annotated[
        str | None,
        typer.Option("--question", help="The recorded run's task, where the recording has none."),
    ] = None,
    instruction: Annotated[
        str | None,
        typer.Option(
            "--instruction",
            help="Text added to the system prompt for the fork's own turns (saved with it).",
        ),
    ] = None,
    **options: Any,
) -> None:
    """Fork RUN at step --at: a new run whose first steps are RUN's, copied from the store
    (nothing sent to a model, no tool run again, counters as they stood), then live with the
    options given. Takes every `keel run` option; RUN is left as it was."""
    from keel._run import Forked

    if at is None:
        usage_error("keel fork: say where to branch with --at STEP")
    if (run_id is None) == (recording is None):
        usage_error("keel fork: name a stored RUN or a --recording FILE (one of them)")
    if run_id is not None and options.get("model") is None:
        options["model"] = _model_of(run_id, options.get("store"))
    built = command_agent(options)
    agent = built.agent
    if instruction:
        agent.system_prompt = f"{agent.system_prompt}\n\n{instruction}"
    guard(lambda: agent.store)
    prefix = _prefix(agent, at, run_id, recording, recording_id, question)
    announce(built)
    finish(agent, lambda: agent.launch(Forked(prefix)), built.extras)


def _prefix(
    agent: Agent,
    at: int,
    run_id: str | None,
    recording: Path | None,
    recording_id: str | None,
    question: str | None,
) -> ForkPrefix:
    """The steps the fork copies: stored run `run_id`'s, else those of the recording (its
    file, its id in the file, and the question where it has none)."""
    from keel._run import prefix_of_run
    from keel.replay.forks import prefix_of_recording

    if run_id is not None:
        return guard(lambda: prefix_of_run(agent.store, run_id, at))
    assert recording is not None
    return guard(lambda: prefix_of_recording(recording, recording_id, at, question, agent.limits))


def _model_of(run_id: str, store: str | None) -> str:
    """The model `run_id` started with: a fork's default."""
    from keel.cli.common import known_run, open_run_store

    db = open_run_store(store, read_only=True)
    try:
        record = guard(lambda: known_run(db, run_id))
    finally:
        db.close()
    return str(record.config.model)


def forked_json(record: RunRecord) -> dict[str, Any] | None:
    """`keel show --json`'s `forked_from`: where the fork branched; None: not a fork."""
    from keel._run import forked_from

    return forked_from(record.config.settings)


def forked_line(record: RunRecord) -> str | None:
    """`keel show`'s line at the branch point of a fork."""
    origin = forked_json(record)
    if origin is None:
        return None
    step = origin.get("step")
    source = (
        f"run {origin['run_id']}"
        if "run_id" in origin
        else f"recording {origin.get('id')} of {origin.get('recording')}"
    )
    return (
        f"forked from {source} at step {step}: steps 0 to {step} are copied from it "
        "(nothing was sent to a model or run again); the fork's own begin at step "
        f"{int(step) + 1 if isinstance(step, int) else '?'}"
    )
