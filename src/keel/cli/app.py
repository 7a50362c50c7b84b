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
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar, cast, get_args

import typer
from rich.console import Console

from keel import approvals
from keel._run.history import continuation
from keel.agent import DEFAULT_SYSTEM_PROMPT, Agent, RunHandle
from keel.cli.agent import command_agent as _agent
from keel.cli.conversation import ask_command, continues_line, conversation_lines
from keel.cli.integrations import RunExtras, mcp_settings
from keel.cli.output import Stdout, keep_standard_fds
from keel.cli.signals import Signals, own_process, stoppable
from keel.config import choose_loop_policy, config_files, public_url, trust, unknown_keys
from keel.durability import Durability, choose_durability
from keel.errors import ConfigError, KeelError
from keel.evals.command import eval_command
from keel.limits import Limits
from keel.models import (
    SPEC_HELP,
    available_models,
    check_base_url,
    choose_model,
    endpoint,
    model_file_line,
)
from keel.options import check_hosts
from keel.pool.commands import after_decision, submit_run, worker_command
from keel.present.progress import watch_local_model
from keel.present.summary import one_line, resume_command, show_command
from keel.present.terminal import describe_call, safe_text
from keel.present.timeline import event_json, json_text, run_json, timeline
from keel.pricing import cost_text
from keel.records import JsonObject, JsonValue
from keel.replay.command import replay_command
from keel.result import RunResult, RunStatus
from keel.store import RunRecord, RunStore, Store, open_store, store_target
from keel.store.locate import default_store_path
from keel.ui.command import ui_command

__all__ = ["app", "main"]

EXIT_CODES = {"completed": 0, "failed": 1, "cancelled": 1, "awaiting_approval": 3}

app = typer.Typer(
    help="Keel: an agent runtime for research runs that end with an answer, a classified "
    "failure, or a durable pause.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,  # plain help: "[default: ...]" stays text, option names are not cut
    pretty_exceptions_enable=False,
)
err = Console(stderr=True)

StoreOption = Annotated[
    str | None,
    typer.Option(
        "--store",
        help="SQLite file of runs, or a postgresql:// URL [default: KEEL_STORE, keel.toml, "
        "else a file under the user data directory]",
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]
ByOption = Annotated[str | None, typer.Option("--by", help="Who decides [default: your user].")]
BaseUrlOption = Annotated[
    str | None,
    typer.Option(help="Server for openai-chat:/openai:/anthropic: (e.g. a local llama.cpp)."),
]
ApiKeyEnvOption = Annotated[
    str | None,
    typer.Option(
        help="Send the key in this environment variable to --base-url (a provider's own key "
        "from the environment goes only to the provider's own host) [default: a placeholder]."
    ),
]
ToolChoiceOption = Annotated[
    str | None,
    typer.Option(
        help="tool_choice to send on ordinary turns: auto, required or none (servers that "
        "ignore tools without it, e.g. llama-cpp-python's chatml-function-calling) "
        "[default: not sent]."
    ),
]
EventsOption = Annotated[
    bool, typer.Option("--events", help="Print each event as a JSON line; the last: the result.")
]
OtelOption = Annotated[
    bool, typer.Option("--otel", help="Export OpenTelemetry spans (OTLP; see OTEL_* variables).")
]
OtelContentOption = Annotated[
    bool, typer.Option("--otel-content", help="Put prompts, answers and tool I/O in the spans.")
]
LoopPolicyOption = Annotated[
    str | None,
    typer.Option(
        help="How identical calls count: progress (a changed world or result restarts a key, "
        "capped) or adr (every identical call counts) [default: keel.toml's loop_policy, "
        "else progress]."
    ),
]
DurabilityOption = Annotated[
    str | None,
    typer.Option(
        help="process: survives a killed process; power: also a power cut (an fsync per "
        "step) [default: keel.toml's durability, else process]."
    ),
]


_JSON_ERRORS: ContextVar[bool] = ContextVar("keel_json_errors", default=False)
"""The command running now was given `--json`: its exit-2 errors go to stdout as JSON too."""

F = TypeVar("F", bound=Callable[..., Any])


def json_errors(command: F) -> F:
    """Let `command`'s ``as_json`` decide how its usage errors are written (`_usage_error`)."""

    @functools.wraps(command)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        token = _JSON_ERRORS.set(bool(kwargs.get("as_json")))
        try:
            return command(*args, **kwargs)
        finally:
            _JSON_ERRORS.reset(token)

    return cast(F, wrapped)


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
        bool, typer.Option(help="Insist on evidence: the first turn must call a tool.")
    ] = False,
    output_schema: Annotated[
        Path | None,
        typer.Option(help="A JSON Schema file: the answer must be JSON that matches it."),
    ] = None,
    submit_: Annotated[bool, typer.Option("--submit", hidden=True)] = False,
    ask_run: Annotated[str | None, typer.Option("--ask-run", hidden=True)] = None,
    fork: Annotated[bool, typer.Option("--fork", hidden=True)] = False,
) -> None:
    """Run an agent on QUESTION with the research tools and print its answer."""
    if not question.strip():
        _usage_error("the question is empty: say what to research")
    if fork and ask_run is None:
        _usage_error("--fork continues an earlier run: use it with keel ask RUN_ID")
    folder = (repo or Path(".")).resolve()
    settings: JsonObject = {
        "repo": str(folder),
        "allow_hosts": cast(list[JsonValue], allow_host or []),
        "allow_writes": allow_writes,
        "browser": browser,
        "mcp": _guard(lambda: mcp_settings(mcp or [], mcp_url or [])),
    }
    for key, value in (
        ("without_tools", without_tool),
        ("tool_choice", tool_choice),
        ("api_key_env", api_key_env),
    ):
        if value:  # saved only when given: a run without them stores what it always did
            settings[key] = cast(JsonValue, value)

    policy = _guard(lambda: choose_loop_policy(loop_policy))

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
            first_turn_tool=first_turn_tool,
        )

    if submit_ and settings["mcp"]:  # workers start no MCP servers (ADR 0026)
        _usage_error(
            "keel submit: MCP servers are not started on workers, so this run would have no "
            "MCP tools there; run it here with keel run"
        )
    _guard(lambda: check_hosts(allow_host or []))
    choice = _guard(lambda: choose_model(model, base_url))
    for warning in choice.warnings:
        err.print(f"keel: {warning}", highlight=False, markup=False, soft_wrap=True)
    if choice.base_url:
        settings["base_url"] = public_url(choice.base_url)  # no credentials in the store
        settings["base_url_redacted"] = settings["base_url"] != choice.base_url
    approved = [t.strip() for t in approve_tools.split(",") if t.strip()]
    schema = None if output_schema is None else _guard(lambda: read_schema(output_schema))
    extras = RunExtras(as_json, events, otel, otel_content)
    level = _guard(lambda: choose_durability(durability))
    agent = _guard(
        lambda: _agent(
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
        _guard(lambda: submit_run(agent, question, as_json))
        return
    _guard(lambda: agent.store)  # a store that cannot open is one line, before anything else
    if ask_run is not None:  # refused here (one line), before the header and any model load
        _guard(lambda: continuation(agent.store, ask_run, fork=fork))
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
    path = _guard(lambda: trust(folder))
    data = _guard(lambda: config_files(path.parent)[0][0].data)
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
    db = _open_store(store, durability=_guard(lambda: choose_durability(durability)))
    record = _guard(lambda: _known_run(db, run_id))
    config = record.config
    settings = dict(config.settings)
    extras = RunExtras(as_json, events, otel, otel_content)
    if base_url:
        _guard(lambda: check_base_url(base_url))
    elif settings.get("base_url_redacted"):
        err.print(
            "keel: the run's base URL held credentials, which are never stored; pass "
            "--base-url again if the server needs them",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
    agent = _guard(
        lambda: _agent(
            model or config.model,
            settings,
            config.limits,
            db,
            extras,
            config.system_prompt or DEFAULT_SYSTEM_PROMPT,
            config.approve_tools,
            base_url or _text(settings.get("base_url")),
        )
    )
    missing = set(config.tools) - {t.name for t in agent.tools}
    if missing:
        extras.close()
        _usage_error(
            f"run {run_id} used tools the command line cannot rebuild "
            f"({', '.join(sorted(missing))}); resume it from your program with Agent.resume"
        )
    _finish(agent, lambda: agent.start_resume(run_id), extras)


@app.command()
def approve(
    run_id: Annotated[str, typer.Argument(help="The paused run.")],
    call_id: Annotated[
        str | None, typer.Argument(help="The call to approve, by Keel's id (e.g. k2_0).")
    ] = None,
    all_calls: Annotated[bool, typer.Option("--all", help="Approve every pending call.")] = False,
    by: ByOption = None,
    store: StoreOption = None,
) -> None:
    """Approve a pending call (or all with --all); `keel resume` then runs it. Final: a call
    someone decided already is refused (exit 2), naming who decided, what and when."""
    if (call_id is None) == (not all_calls):
        _usage_error("name one CALL_ID, or pass --all (and not both)")
    db = _open_store(store)
    try:
        ids = _guard(lambda: approvals.approve(db, run_id, call_id, by))
    finally:
        db.close()
    if not ids:
        _usage_error(f"run {run_id} has no call awaiting a decision")
    for one in ids:
        typer.echo(f"approved {one}")
    err.print(_guard(lambda: after_decision(store, run_id)), highlight=False)


@app.command()
def deny(
    run_id: Annotated[str, typer.Argument(help="The paused run.")],
    call_id: Annotated[str, typer.Argument(help="The call to deny, by Keel's id (e.g. k2_0).")],
    reason: Annotated[str, typer.Option(help="Why; the model is told.")],
    by: ByOption = None,
    store: StoreOption = None,
) -> None:
    """Deny a pending call; the model hears who denied it and why, and not to retry it. Final,
    like an approval."""
    db = _open_store(store)
    try:
        _guard(lambda: approvals.deny(db, run_id, call_id, reason, by))
    finally:
        db.close()
    typer.echo(f"denied {call_id}")
    err.print(_guard(lambda: after_decision(store, run_id)), highlight=False)


@app.command()
@json_errors
def show(
    run_id: Annotated[str, typer.Argument(help="The run's id, as `keel runs` lists it.")],
    as_json: JsonOption = False,
    store: StoreOption = None,
) -> None:
    """Show a run and its timeline: turns, calls, results, elisions, approvals, the end."""
    db = _open_store(store, read_only=True)
    try:
        record = _guard(lambda: _known_run(db, run_id))
        events = _guard(lambda: db.events(run_id))
    finally:
        db.close()
    sampling = record.config.settings.get("sampling")  # a local model's pinned sampling
    if as_json:
        shown = {"run": run_json(record), "events": [event_json(e) for e in events]}
        shown["loop_rules"] = _loop_rules(record.config.limits)
        if sampling is not None:
            shown["sampling"] = sampling
        typer.echo(json_text(shown))
        return
    out = Console()
    summary = run_json(record)
    where = endpoint(record.config.model, _text(record.config.settings.get("base_url")))
    out.print(
        f"{record.run_id} · {summary['status']} · model {safe_text(record.model)} at "
        f"{safe_text(where)}",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )
    if isinstance(sampling, dict):
        pinned = ", ".join(f"{k} {v}" for k, v in sampling.items())
        out.print(f"sampling: {safe_text(pinned)}", highlight=False, markup=False)
    rules = _loop_rules(record.config.limits)
    out.print(
        f"loop rules: policy {rules['policy']}, threshold {rules['threshold']}, "
        f"evidence resets {rules['evidence_reset_cap']} per key",
        highlight=False,
        markup=False,
    )
    if record.status == "cancelled":
        out.print(
            f"interrupted at step {record.state.step}; continue it with: "
            f"{_resume_line(record.run_id, db)}",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
    follows = continues_line(record)
    if follows is not None:
        out.print(follows, highlight=False, markup=False)
    out.print(f"question: {safe_text(record.question)}", highlight=False, markup=False)
    out.print(timeline(events))
    state = record.state
    out.print(
        f"spent: {state.model_calls} model calls · {state.tool_calls} tool calls · "
        f"{state.usage.input_tokens}+{state.usage.output_tokens} tokens · "
        f"{cost_text(state.cost)}",
        highlight=False,
        markup=False,
    )
    if summary["answer"]:
        out.print(f"\nanswer: {safe_text(summary['answer'])}", highlight=False, markup=False)


def _loop_rules(limits: Limits) -> dict[str, Any]:
    """The identical-call rules a run was started with (and resumes with)."""
    return {
        "policy": limits.loop_policy,
        "threshold": limits.loop_threshold,
        "evidence_reset_cap": limits.evidence_reset_cap,
    }


@app.command()
def runs(
    store: StoreOption = None,
    limit: Annotated[int, typer.Option(help="How many runs to list.")] = 20,
    status: Annotated[
        str | None,
        typer.Option(help="Only runs in this status: queued, running, awaiting_approval, ..."),
    ] = None,
) -> None:
    """List recent runs, newest first."""
    if status is not None and status not in get_args(RunStatus):
        _usage_error(f"--status must be one of {', '.join(get_args(RunStatus))}")
    db = _open_store(store, read_only=True)
    try:
        records = _guard(lambda: db.list_runs(limit, status))
    finally:
        db.close()

    def line(r: RunRecord) -> str:
        return (
            f"{r.run_id}  {r.status:<17} {r.state.model_calls:>3} model "
            f"{r.state.tool_calls:>4} tools {cost_text(r.state.cost):>9}  "
            f"{safe_text(r.question[:70])}"
        )

    for text in conversation_lines(records, line):
        typer.echo(text)
    interrupted = [r.run_id for r in records if r.status == "cancelled"]
    if interrupted:
        typer.echo(
            f"\ncancelled runs were interrupted, not ended; continue one with: "
            f"{_resume_line(interrupted[0], db)}"
        )


app.command("eval")(eval_command)
app.command("replay")(replay_command)
app.command("ui")(ui_command)


@app.command()
def models() -> None:
    """List the model specs Keel can use here, and which one a run would use by default."""
    choice = _guard(lambda: choose_model())
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


def _resume_line(run_id: str, db: RunStore) -> str:
    """`keel resume RUN_ID`, with `--store` when the run is not in the default store."""
    return resume_command(run_id, db.path, default_store_path())


def _text(value: JsonValue) -> str | None:
    return None if value is None else str(value)


def _finish(agent: Agent, start: Callable[[], RunHandle], extras: RunExtras) -> NoReturn:
    _guard(extras.start_export)
    with extras, agent:
        if not extras.quiet:
            watch_local_model(agent, err)
        result = _guard(lambda: Signals.active().run(start))
        summary = one_line(result, agent.store.events(result.run_id))
        show = show_command(result.run_id, agent.store.path, default_store_path())
        if result.status == "cancelled":  # an interruption: say how to go on
            show += f"\ncontinue it with: {_resume_line(result.run_id, agent.store)}"
    if not extras.wrote(result):
        shown = result.answer is not None and extras.answer_shown(result.answer)
        _print_result(result, extras.as_json, extras.out, answer_shown=shown)
    if extras.out.failure is not None:  # the run is stored: say where, in one line
        err.print(
            f"keel: {extras.out.failure}; the rest of the output was dropped; run "
            f"{result.run_id} ended {result.status}: {show}",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
    if not extras.quiet:
        err.print(f"{summary}\nopen it with: {show}", highlight=False, markup=False, soft_wrap=True)
    raise typer.Exit(EXIT_CODES[result.status])


def _print_result(
    result: RunResult, as_json: bool, out: Stdout, *, answer_shown: bool = False
) -> None:
    """`answer_shown`: the answer was printed as it was written (a terminal)."""
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


def _open_store(
    given: str | None, *, read_only: bool = False, durability: Durability = "process"
) -> RunStore:
    """An existing store; `read_only` for the commands that only look (`runs`, `show`): they
    never write to it, not even a schema upgrade, and work on a read-only file or folder."""
    target = _guard(lambda: store_target(given))
    if isinstance(target, Path) and not target.exists():
        _usage_error(f"no store at {target} (run `keel run` first)")
    if isinstance(target, Path):
        return _guard(lambda: Store(target, read_only=read_only, durability=durability))
    return _guard(lambda: open_store(target, read_only=read_only))


def _known_run(db: RunStore, run_id: str) -> Any:
    record = db.get_run(run_id)
    if record is None:
        raise ConfigError(f"no run {run_id} in {db.path}")
    return record


T = TypeVar("T")


def _guard(action: Callable[[], T]) -> T:
    """Misuse and refusals become a message and exit code 2, never a traceback."""
    try:
        return action()
    except (ConfigError, KeelError) as exc:
        _usage_error(str(exc), type(exc).__name__)


def _usage_error(message: str, kind: str = "UsageError") -> NoReturn:
    """One line on stderr, exit code 2; under `--json` also the error as one JSON object on
    stdout, so a program reading the JSON always has something to parse. `kind`: the error's
    class name (``ConfigError``, ``LeaseHeld``), like a failed run's ``failure.kind``."""
    err.print(f"keel: {message}", highlight=False, markup=False, soft_wrap=True)
    _json_error(kind, message)
    raise typer.Exit(2)


def _json_error(kind: str, message: str) -> None:
    if _JSON_ERRORS.get():
        typer.echo(json_text({"error": {"kind": kind, "message": message}}))


def main() -> None:
    own_process()
    keep_standard_fds()
    for warning in unknown_keys():  # once per command, whichever reads the file
        err.print(f"keel: {warning}", highlight=False, markup=False, soft_wrap=True)
    try:
        app()
    except ConfigError as exc:
        err.print(f"keel: {exc}", highlight=False, markup=False)
        sys.exit(2)
