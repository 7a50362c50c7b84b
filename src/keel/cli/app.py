"""The `keel` command: a thin layer over the library.

Exit codes: 0 completed, 1 failed or cancelled (also: stopped by SIGINT, SIGTERM or SIGHUP
before the run started), 2 bad usage or configuration (including a run another live process is
advancing), 3 awaiting approval. Output that cannot be written changes none of them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from keel.cli.cancel import cancel
from keel.cli.common import (
    EXIT_CODES,
    BaseUrlOption,
    DurabilityOption,
    EventsOption,
    JsonOption,
    OtelContentOption,
    OtelOption,
    StoreOption,
    err,
    guard,
    json_errors,
    known_run,
    open_run_store,
    text_of,
    usage_error,
)
from keel.cli.conversation import ask
from keel.cli.decisions import answer
from keel.cli.finish import announce, finish
from keel.cli.flags import command_agent, with_agent_options
from keel.cli.fork import fork
from keel.cli.index import index_command
from keel.cli.inspect import approve, deny, runs, show
from keel.cli.output import keep_standard_fds
from keel.cli.serve import serve
from keel.cli.signals import own_process, stoppable
from keel.config import trust
from keel.errors import ConfigError
from keel.evals.command import eval_command
from keel.models import available_models, check_base_url, choose_model, model_file_line
from keel.pool.commands import submit_run, worker_command
from keel.replay.command import replay_command
from keel.run_options import resolve_one, unknown_keys
from keel.ui.command import ui_command

__all__ = ["app", "main"]

APP_SETTINGS: dict[str, Any] = {
    "help": "Keel: an agent runtime for research runs that end with an answer, a classified "
    "failure, or a durable pause.",
    "no_args_is_help": True,
    "add_completion": False,
    "rich_markup_mode": None,  # plain help: "[default: ...]" stays text, option names not cut
    "pretty_exceptions_enable": False,
}
app = typer.Typer(**APP_SETTINGS)


@app.command()
@json_errors
@stoppable(EXIT_CODES, err)
@with_agent_options()
def run(question: Annotated[str, typer.Argument(help="What to research.")], **options: Any) -> None:
    """Run an agent on QUESTION with the research tools and print its answer.

    Each option can also come from the environment (KEEL_ and its name: KEEL_MAX_MODEL_CALLS)
    or a keel.toml key (max_model_calls); a flag wins, then the environment, then keel.toml.
    """
    if not question.strip():
        usage_error("the question is empty: say what to research")
    built = command_agent(options)
    guard(lambda: built.agent.store)  # a store that cannot open is one line, before anything
    announce(built)
    finish(built.agent, lambda: built.agent.start(question), built.extras)


@app.command("trust")
def trust_command(
    folder: Annotated[
        Path, typer.Argument(help="The folder whose keel.toml to trust [default: here].")
    ] = Path("."),
    grant: Annotated[
        list[str] | None,
        typer.Option(
            help="Also grant this key, which trust alone does not (repeatable): api_key_env, "
            "allow_writes, approve_tools, allow_hosts, agents."
        ),
    ] = None,
) -> None:
    """Trust the keel.toml in FOLDER as it is now, so `keel run` uses its model, base_url and
    ordinary settings; the keys that reach further are granted one by one (--grant KEY, or
    asked about each on a terminal), and each is named with what it does.

    A keel.toml in the working directory is ignored until trusted: a repository could otherwise
    send your API key to a host of its choosing. Editing the file withdraws the trust."""
    from keel.cli.trusting import ask_each, keys_of, lines

    path = guard(lambda: trust(folder, grant or []))
    data = guard(lambda: keys_of(path))
    chosen = ask_each(data, grant or [])
    if chosen != (grant or []):
        guard(lambda: trust(folder, chosen))
    for line in lines(path, data, chosen):
        typer.echo(line)


@app.command("submit")
@json_errors
@with_agent_options(output=("as_json",))
def submit(
    question: Annotated[str, typer.Argument(help="What to research.")], **options: Any
) -> None:
    """Queue QUESTION for `keel worker`s (a postgresql:// --store) and print its run id at once.
    Takes every `keel run` option; --mcp/--mcp-url are refused: workers start no MCP servers."""
    if not question.strip():
        usage_error("the question is empty: say what to research")
    as_json = bool(options.get("as_json"))
    built = command_agent(options, workers=True)
    guard(lambda: submit_run(built.agent, question, as_json))


app.command("worker")(worker_command)
app.command("ask")(ask)
app.command("fork")(fork)
app.command("serve")(serve)


@app.command()
@json_errors
@stoppable(EXIT_CODES, err)
def resume(
    run_id: Annotated[str, typer.Argument(help="The run to continue.")],
    as_json: JsonOption = False,
    store: StoreOption = None,
    model: Annotated[
        str | None, typer.Option(help="Model spec [default: the one the run started with].")
    ] = None,
    base_url: BaseUrlOption = None,
    events: EventsOption = False,
    otel: OtelOption = False,
    otel_content: OtelContentOption = False,
    durability: DurabilityOption = None,
    mcp_env: Annotated[
        list[str] | None,
        typer.Option(help="NAME=VALUE set for the run's --mcp servers, given again (repeatable)."),
    ] = None,
) -> None:
    """Continue a run that has not ended: after a pause for approval, an interruption (Ctrl-C:
    the run is `cancelled`) or a crash."""
    from keel.agent import DEFAULT_SYSTEM_PROMPT
    from keel.assemble import build_agent
    from keel.cli.integrations import RunExtras
    from keel.tools.mcp_servers import resumed_values

    db = open_run_store(store, durability=guard(lambda: resolve_one("durability", durability)))
    record = guard(lambda: known_run(db, run_id))
    config = record.config
    settings = dict(config.settings)
    extras = RunExtras(as_json, events, otel, otel_content)
    extras.mcp_values = guard(lambda: resumed_values(settings, mcp_env or []))
    if base_url:
        guard(lambda: check_base_url(base_url))
    elif settings.get("base_url_redacted"):
        err.print(
            "keel: the run's base URL held credentials, which are never stored; pass "
            "--base-url again if the server needs them",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
    agent = guard(
        lambda: build_agent(
            model or config.model,
            settings,
            config.limits,
            db,
            extras,
            config.system_prompt or DEFAULT_SYSTEM_PROMPT,
            config.approve_tools,
            base_url or text_of(settings.get("base_url")),
        )
    )
    missing = set(config.tools) - {t.name for t in agent.tools}
    if missing:
        extras.close()
        usage_error(
            f"run {run_id} used tools the command line cannot rebuild "
            f"({', '.join(sorted(missing))}); resume it from your program with Agent.resume"
        )
    finish(agent, lambda: agent.start_resume(run_id), extras)


app.command()(approve)
app.command()(deny)
app.command()(answer)
app.command()(show)
app.command()(runs)
app.command()(cancel)
app.command("eval")(eval_command)
app.command("replay")(replay_command)
app.command("ui")(ui_command)
app.command("index")(index_command)


@app.command()
def models() -> None:
    """List the model specs Keel can use here, which one a run would use by default, and the
    context window of each model Keel knows."""
    from keel.windows import UNKNOWN_WINDOW, WindowTable, window_for, window_line

    choice = guard(lambda: choose_model())
    for spec, usable, note in available_models():
        mark = "yes" if usable else "no "
        typer.echo(f"{mark}  {spec:<22} {note}")
    typer.echo(f"\ndefault: {choice.spec} ({choice.source})")
    configured = guard(lambda: resolve_one("context_window"))
    typer.echo(f"its window: {window_line(window_for(choice.spec, configured))}")
    typer.echo(f"local model file: {model_file_line(choice.spec)}")
    table = WindowTable.shipped()
    typer.echo(f"\ncontext windows (keel/data/windows.toml, as of {table.date}):")
    for spec, window in table.rows():
        typer.echo(f"  {spec:<34} {window_line(window)}")
    typer.echo(f"  {'any model not listed':<34} {window_line(UNKNOWN_WINDOW)}")
    typer.echo("  (--context-window or context_window in keel.toml sets a model's window)")


def main() -> None:
    own_process()
    keep_standard_fds()
    for warning in unknown_keys():  # once per command, whichever reads the file
        err.print(f"keel: {warning}", highlight=False, markup=False, soft_wrap=True)
    try:
        command_line(sys.argv[1:2])()
    except ConfigError as exc:
        err.print(f"keel: {exc}", highlight=False, markup=False)
        sys.exit(2)


def command_line(first: list[str]) -> Callable[[], Any]:
    """The app to run for a command line whose first argument is `first`: when it names a
    command, a group of that command alone, so typer reads one command's signature and options
    instead of all of them (about 20 ms of every start, ADR 0042); else (no argument, `--help`,
    an unknown name) the whole app, which lists every command. The group has the app's name
    and settings, so the command's usage, help and errors read the same."""
    by_name = {command_name(info): info for info in app.registered_commands}
    info = by_name.get(first[0]) if first else None
    if info is None:
        return app
    alone = typer.Typer(**APP_SETTINGS)
    alone.registered_commands = [info]
    return typer.main.get_group(alone)


def command_name(info: typer.models.CommandInfo) -> str:
    """The name typer gives a registered command: its own, else its function's, dashed."""
    if info.name:
        return info.name
    assert info.callback is not None
    return typer.main.get_command_name(info.callback.__name__)
