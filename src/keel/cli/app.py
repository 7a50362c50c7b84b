"""The `keel` command: a thin layer over the library.

Exit codes: 0 completed, 1 failed or cancelled (also: stopped by SIGINT, SIGTERM or SIGHUP
before the run started), 2 bad usage or configuration (including a run another live process is
advancing), 3 awaiting approval. Output that cannot be written changes none of them.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, cast

import typer

from keel.cli.common import (
    EXIT_CODES,
    ApiKeyEnvOption,
    BaseUrlOption,
    DurabilityOption,
    EventsOption,
    JsonOption,
    LoopPolicyOption,
    OtelContentOption,
    OtelOption,
    StoreOption,
    ToolChoiceOption,
    err,
    guard,
    json_errors,
    known_run,
    open_run_store,
    resume_line,
    text_of,
    usage_error,
)
from keel.cli.conversation import ask_command
from keel.cli.inspect import approve, deny, runs, show
from keel.cli.output import Stdout, keep_standard_fds
from keel.cli.serve import SERVING, serve_command
from keel.cli.signals import Signals, own_process, stoppable
from keel.config import choose_loop_policy, config_files, public_url, trust, unknown_keys
from keel.durability import choose_durability
from keel.errors import ConfigError
from keel.evals.command import eval_command
from keel.limits import Limits
from keel.models import (
    SPEC_HELP,
    available_models,
    check_base_url,
    choose_model,
    endpoint,
    first_turn_tool_default,
    model_file_line,
)
from keel.options import check_hosts
from keel.pool.commands import submit_run, worker_command
from keel.present.terminal import describe_call, safe_text
from keel.replay.command import replay_command
from keel.ui.command import ui_command

if TYPE_CHECKING:
    # The run core, the store, the transports and the tools are imported by the commands
    # that use them, so `keel --help` starts without them (ADR 0042;
    # tests/test_startup_imports.py names what it must not load).
    from keel.agent import Agent, RunHandle
    from keel.cli.integrations import RunExtras
    from keel.records import JsonObject, JsonValue
    from keel.result import RunResult

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
def run(
    question: Annotated[str, typer.Argument(help="What to research.")],
    model: Annotated[
        str | None, typer.Option(help=f"Model spec: {SPEC_HELP} [default: see `keel models`].")
    ] = None,
    base_url: BaseUrlOption = None,
    api_key_env: ApiKeyEnvOption = None,
    tool_choice: ToolChoiceOption = None,
    as_json: JsonOption = False,
    store: StoreOption = None,
    repo: Annotated[
        Path | None,
        typer.Option(
            help="Folder the file tools may read (nothing outside it) [default: the current "
            "folder, named before the run starts]."
        ),
    ] = None,
    allow_host: Annotated[
        list[str] | None,
        typer.Option(help="Let fetch reach this loopback/private host (repeatable)."),
    ] = None,
    allow_writes: Annotated[
        bool, typer.Option(help="Offer write_file under --repo (each write asks approval).")
    ] = False,
    approve_tools: Annotated[
        str, typer.Option(help="Comma-separated tools whose calls are pre-approved.")
    ] = "",
    without_tool: Annotated[
        list[str] | None,
        typer.Option(help="Leave out this built-in tool (e.g. fetch, for an MCP one; repeatable)."),
    ] = None,
    browser: Annotated[
        bool, typer.Option(help="Offer browser_observe/browser_act (headless Chromium).")
    ] = False,
    loop_threshold: Annotated[int, typer.Option(help="Identical-call limit T (>= 2).")] = 5,
    evidence_reset_cap: Annotated[int, typer.Option(help="Evidence resets per call key.")] = 3,
    loop_policy: LoopPolicyOption = None,
    max_model_calls: Annotated[int, typer.Option(help="Model-call budget.")] = 50,
    max_tool_calls: Annotated[int, typer.Option(help="Tool-call budget.")] = 200,
    max_tokens: Annotated[
        int | None, typer.Option(help="Input+output token budget [default: none].")
    ] = None,
    max_cost: Annotated[
        float | None,
        typer.Option(help="Cost budget in US dollars, from the price table [default: none]."),
    ] = None,
    deadline: Annotated[
        float | None, typer.Option(help="Wall-clock limit in seconds [default: none].")
    ] = None,
    deadline_reserve: Annotated[
        float | None,
        typer.Option(
            help="Seconds kept before --deadline for the final answer [default: twice the "
            "run's longest model call, at least 1]."
        ),
    ] = None,
    model_timeout: Annotated[
        float, typer.Option(help="Seconds one model attempt may take in all (retryable past it).")
    ] = 600.0,
    context_tokens: Annotated[
        int, typer.Option(help="Context budget; older large results are elided past it.")
    ] = 100_000,
    mcp: Annotated[
        list[str] | None,
        typer.Option(
            help='An MCP server to start: "CMD ARGS", or "prefix=NAME_:CMD ARGS" to put NAME_ '
            "before its tool names (repeatable)."
        ),
    ] = None,
    mcp_url: Annotated[
        list[str] | None,
        typer.Option(help='An MCP server at this streamable HTTP URL (or "prefix=NAME_:URL").'),
    ] = None,
    events: EventsOption = False,
    otel: OtelOption = False,
    otel_content: OtelContentOption = False,
    durability: DurabilityOption = None,
    first_turn_tool: Annotated[
        bool | None,
        typer.Option(
            "--first-turn-tool/--no-first-turn-tool",
            help="Insist on evidence: the first turn must call a tool [default: on for the "
            "local model, off for others].",
            show_default=False,
        ),
    ] = None,
    output_schema: Annotated[
        Path | None,
        typer.Option(help="A JSON Schema file: the answer must be JSON that matches it."),
    ] = None,
    submit_: Annotated[bool, typer.Option("--submit", hidden=True)] = False,
    ask_run: Annotated[str | None, typer.Option("--ask-run", hidden=True)] = None,
    fork: Annotated[bool, typer.Option("--fork", hidden=True)] = False,
) -> None:
    """Run an agent on QUESTION with the research tools and print its answer."""
    from keel._run.history import continuation
    from keel.cli.agent import command_agent
    from keel.cli.integrations import RunExtras, mcp_settings
    from keel.store import store_target

    if not question.strip():
        usage_error("the question is empty: say what to research")
    if fork and ask_run is None:
        usage_error("--fork continues an earlier run: use it with keel ask RUN_ID")
    folder = (repo or Path(".")).resolve()
    settings: JsonObject = {
        "repo": str(folder),
        "allow_hosts": cast("list[JsonValue]", allow_host or []),
        "allow_writes": allow_writes,
        "browser": browser,
        "mcp": guard(lambda: mcp_settings(mcp or [], mcp_url or [])),
    }
    for key, value in (
        ("without_tools", without_tool),
        ("tool_choice", tool_choice),
        ("api_key_env", api_key_env),
    ):
        if value:  # saved only when given: a run without them stores what it always did
            settings[key] = cast("JsonValue", value)

    policy = guard(lambda: choose_loop_policy(loop_policy))

    def limits() -> Limits:
        return Limits(
            loop_threshold=loop_threshold,
            evidence_reset_cap=evidence_reset_cap,
            loop_policy=policy,
            max_model_calls=max_model_calls,
            max_tool_calls=max_tool_calls,
            max_tokens=max_tokens,
            max_cost=max_cost,
            deadline=deadline,
            deadline_reserve=deadline_reserve,
            model_timeout=model_timeout,
            context_tokens=context_tokens,
            first_turn_tool=insist,
        )

    if submit_ and settings["mcp"]:  # workers start no MCP servers (ADR 0026)
        usage_error(
            "keel submit: MCP servers are not started on workers, so this run would have no "
            "MCP tools there; run it here with keel run"
        )
    guard(lambda: check_hosts(allow_host or []))
    choice = guard(lambda: choose_model(model, base_url))
    insist = first_turn_tool_default(choice.spec) if first_turn_tool is None else first_turn_tool
    settings["first_turn_tool"] = "default" if first_turn_tool is None else "given"
    for warning in choice.warnings:
        err.print(f"keel: {warning}", highlight=False, markup=False, soft_wrap=True)
    if choice.base_url:
        settings["base_url"] = public_url(choice.base_url)  # no credentials in the store
        settings["base_url_redacted"] = settings["base_url"] != choice.base_url
    approved = [t.strip() for t in approve_tools.split(",") if t.strip()]
    schema = None if output_schema is None else guard(lambda: read_schema(output_schema))
    extras = RunExtras(as_json, events, otel, otel_content)
    level = guard(lambda: choose_durability(durability))
    agent = guard(
        lambda: command_agent(
            choice.spec,
            settings,
            limits(),
            store_target(store),
            extras,
            approve_tools=approved,
            base_url=choice.base_url,
            durability=level,
            output_type=schema,
        )
    )
    if submit_:
        guard(lambda: submit_run(agent, question, as_json))
        return
    if (serving := SERVING.get()) is not None:  # `keel serve`: this agent, served
        serving(agent, extras)
        return
    guard(lambda: agent.store)  # a store that cannot open is one line, before anything else
    if ask_run is not None:  # refused here (one line), before the header and any model load
        guard(lambda: continuation(agent.store, ask_run, fork=fork))
    if not (as_json or events):  # the human form only: JSON output stays exactly JSON
        _header(choice.spec, choice.base_url, choice.source)
        if repo is None:  # the file tools' folder was not chosen: say which one they read
            err.print(
                f"repo: {safe_text(str(folder))} (the current folder; --repo DIR to choose)",
                highlight=False,
                markup=False,
                soft_wrap=True,
                style="dim",
            )
    if ask_run is None:
        _finish(agent, lambda: agent.start(question), extras)
    follows = ask_run
    _finish(agent, lambda: agent.start_ask(follows, question, fork=fork), extras)


@app.command("trust")
def trust_command(
    folder: Annotated[
        Path, typer.Argument(help="The folder whose keel.toml to trust [default: here].")
    ] = Path("."),
) -> None:
    """Trust the keel.toml in FOLDER as it is now, so `keel run` uses its model and base_url.

    A keel.toml in the working directory is ignored until trusted: a repository could otherwise
    send your API key to a host of its choosing. Editing the file withdraws the trust."""
    path = guard(lambda: trust(folder))
    data = guard(lambda: config_files(path.parent)[0][0].data)
    what = ", ".join(f"{k} = {v!r}" for k, v in data.items() if k in ("model", "base_url"))
    typer.echo(f"trusted {path}" + (f" ({safe_text(what)})" if what else ""))


@app.command("submit")
@functools.wraps(run, assigned=("__module__", "__annotations__"))
def submit(**options: Any) -> None:
    """Queue QUESTION for `keel worker`s (a postgresql:// --store) and print its run id at once.
    Takes every `keel run` option but --mcp/--mcp-url: workers start no MCP servers."""
    run(**{**options, "submit_": True})


app.command("worker")(worker_command)
app.command("ask")(ask_command(run))
app.command("serve")(serve_command(run))


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
) -> None:
    """Continue a run that has not ended: after a pause for approval, an interruption (Ctrl-C:
    the run is `cancelled`) or a crash."""
    from keel.agent import DEFAULT_SYSTEM_PROMPT
    from keel.cli.agent import command_agent
    from keel.cli.integrations import RunExtras

    db = open_run_store(store, durability=guard(lambda: choose_durability(durability)))
    record = guard(lambda: known_run(db, run_id))
    config = record.config
    settings = dict(config.settings)
    extras = RunExtras(as_json, events, otel, otel_content)
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
        lambda: command_agent(
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
    _finish(agent, lambda: agent.start_resume(run_id), extras)


app.command()(approve)
app.command()(deny)
app.command()(show)
app.command()(runs)
app.command("eval")(eval_command)
app.command("replay")(replay_command)
app.command("ui")(ui_command)


@app.command()
def models() -> None:
    """List the model specs Keel can use here, and which one a run would use by default."""
    choice = guard(lambda: choose_model())
    for spec, usable, note in available_models():
        mark = "yes" if usable else "no "
        typer.echo(f"{mark}  {spec:<22} {note}")
    typer.echo(f"\ndefault: {choice.spec} ({choice.source})")
    typer.echo(f"local model file: {model_file_line(choice.spec)}")


# -- helpers ---------------------------------------------------------------------------------


def _header(spec: str, base_url: str | None, source: str) -> None:
    """Where the run's requests (and the API key) go, before anything is sent."""
    err.print(
        f"model {safe_text(spec)} at {safe_text(endpoint(spec, base_url))} (from {source})",
        highlight=False,
        markup=False,
        soft_wrap=True,
        style="dim",
    )


def _finish(agent: Agent, start: Callable[[], RunHandle], extras: RunExtras) -> NoReturn:
    from keel.present.progress import watch_local_model
    from keel.present.summary import one_line, show_command
    from keel.store.locate import default_store_path

    guard(extras.start_export)
    with extras, agent:
        if not extras.quiet:
            watch_local_model(agent, err)
        result = guard(lambda: Signals.active().run(start))
        summary = one_line(result, agent.store.events(result.run_id))
        opening = show_command(result.run_id, agent.store.path, default_store_path())
        if result.status == "cancelled":  # an interruption: say how to go on
            opening += f"\ncontinue it with: {resume_line(result.run_id, agent.store)}"
    if not extras.wrote(result):
        shown = result.answer is not None and extras.answer_shown(result.answer)
        _print_result(result, extras.as_json, extras.out, answer_shown=shown)
    if extras.out.failure is not None:  # the run is stored: say where, in one line
        err.print(
            f"keel: {extras.out.failure}; the rest of the output was dropped; run "
            f"{result.run_id} ended {result.status}: {opening}",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
    if not extras.quiet:
        err.print(
            f"{summary}\nopen it with: {opening}", highlight=False, markup=False, soft_wrap=True
        )
    raise typer.Exit(EXIT_CODES[result.status])


def _print_result(
    result: RunResult, as_json: bool, out: Stdout, *, answer_shown: bool = False
) -> None:
    """`answer_shown`: the answer was printed as it was written (a terminal)."""
    from keel.present.timeline import json_text
    from keel.pricing import cost_text

    if as_json:
        out.line(json_text(result.to_dict()))
        return
    if result.answer is not None and not answer_shown:
        out.line(safe_text(result.answer))
    status: str = result.status
    if result.synthesized:
        status += f" (synthesized: {result.synthesized})"
    if result.cut_off:
        status += " (the answer was cut off at the model's output limit)"
    if result.partial:
        gaps = "; ".join(result.gaps) or "none named"
        status += f" (partial structured answer; gaps: {gaps})"
    if result.failure:
        status += f": {result.failure.kind}: {result.failure.message}"
    for pending in result.pending_approvals:
        call = "\n  ".join(describe_call(pending.name, pending.arguments))
        note = f"\n  note: {pending.note}" if pending.note else ""
        err.print(
            f"awaiting approval: {pending.call_id} {call}{note}\n"
            f"  keel approve {result.run_id} {pending.call_id}   or   "
            f"keel deny {result.run_id} {pending.call_id} --reason TEXT",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
    err.print(
        f"{safe_text(status)} · run {result.run_id} · {result.model_calls} model calls · "
        f"{result.tool_calls} tool calls · {result.usage.input_tokens}+"
        f"{result.usage.output_tokens} tokens · {cost_text(result.cost)}",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )


def read_schema(path: Path) -> dict[str, Any]:
    """`--output-schema FILE`: a JSON object, else a ConfigError naming the file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ConfigError(
            f"--output-schema {path}: cannot read a JSON Schema from it: {exc}"
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(f"--output-schema {path}: a JSON Schema is a JSON object")
    return data


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
