"""The `keel` command: a thin layer over the library.

Exit codes: 0 completed, 1 failed or cancelled, 2 bad usage or configuration (including a run
another live process is advancing), 3 awaiting approval.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar, cast

import typer
from rich.console import Console

from keel import approvals
from keel.agent import DEFAULT_SYSTEM_PROMPT, Agent, RunHandle, default_store_path
from keel.errors import ConfigError, KeelError
from keel.evals.command import eval_command
from keel.limits import Limits
from keel.models import SPEC_HELP, available_models, choose_model
from keel.progress import ProgressPrinter, watch_local_model
from keel.records import JsonObject, JsonValue
from keel.result import RunResult
from keel.store import Store
from keel.summary import one_line, show_command
from keel.timeline import event_json, run_json, timeline
from keel.tools.base import Tool
from keel.tools.files import file_tools
from keel.tools.web import web_tools
from keel.tools.writes import write_tools

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
    Path | None,
    typer.Option("--store", help="SQLite file of runs [default: under the user data directory]"),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]
ByOption = Annotated[str | None, typer.Option("--by", help="Who decides [default: your user].")]
BaseUrlOption = Annotated[
    str | None,
    typer.Option(help="Server for openai-chat:/openai:/anthropic: (e.g. a local llama.cpp)."),
]


@app.command()
def run(
    question: Annotated[str, typer.Argument(help="What to research.")],
    model: Annotated[
        str | None, typer.Option(help=f"Model spec: {SPEC_HELP} [default: see `keel models`].")
    ] = None,
    base_url: BaseUrlOption = None,
    as_json: JsonOption = False,
    store: StoreOption = None,
    repo: Annotated[
        Path, typer.Option(help="Folder the file tools may read (nothing outside it).")
    ] = Path("."),
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
    browser: Annotated[
        bool, typer.Option(help="Offer browser_observe/browser_act (headless Chromium).")
    ] = False,
    loop_threshold: Annotated[int, typer.Option(help="Identical-call limit T (>= 2).")] = 5,
    evidence_reset_cap: Annotated[int, typer.Option(help="Evidence resets per call key.")] = 3,
    max_model_calls: Annotated[int, typer.Option(help="Model-call budget.")] = 50,
    max_tool_calls: Annotated[int, typer.Option(help="Tool-call budget.")] = 200,
    max_tokens: Annotated[
        int | None, typer.Option(help="Input+output token budget [default: none].")
    ] = None,
    deadline: Annotated[
        float | None, typer.Option(help="Wall-clock limit in seconds [default: none].")
    ] = None,
    context_tokens: Annotated[
        int, typer.Option(help="Context budget; older large results are elided past it.")
    ] = 100_000,
    first_turn_tool: Annotated[
        bool, typer.Option(help="Insist on evidence: the first turn must call a tool.")
    ] = False,
) -> None:
    """Run an agent on QUESTION with the research tools and print its answer."""
    settings: JsonObject = {
        "repo": str(repo.resolve()),
        "allow_hosts": cast(list[JsonValue], allow_host or []),
        "allow_writes": allow_writes,
        "browser": browser,
    }

    def limits() -> Limits:
        return Limits(
            loop_threshold=loop_threshold,
            evidence_reset_cap=evidence_reset_cap,
            max_model_calls=max_model_calls,
            max_tool_calls=max_tool_calls,
            max_tokens=max_tokens,
            deadline=deadline,
            context_tokens=context_tokens,
            first_turn_tool=first_turn_tool,
        )

    choice = _guard(lambda: choose_model(model, base_url))
    settings["base_url"] = choice.base_url
    approved = [t.strip() for t in approve_tools.split(",") if t.strip()]
    agent = _guard(
        lambda: _agent(choice.spec, settings, limits(), store, as_json, approve_tools=approved)
    )
    _finish(agent, lambda: agent.start(question), as_json)


@app.command()
def resume(
    run_id: Annotated[str, typer.Argument(help="The run to continue.")],
    as_json: JsonOption = False,
    store: StoreOption = None,
    model: Annotated[
        str | None, typer.Option(help="Model spec [default: the one the run started with].")
    ] = None,
    base_url: BaseUrlOption = None,
) -> None:
    """Continue a run that has not ended: after a pause for approval, or a crash."""
    db = _open_store(store)
    record = _guard(lambda: _known_run(db, run_id))
    config = record.config
    settings = dict(config.settings)
    if base_url:
        settings["base_url"] = base_url
    agent = _guard(
        lambda: _agent(
            model or config.model,
            settings,
            config.limits,
            db,
            as_json,
            config.system_prompt or DEFAULT_SYSTEM_PROMPT,
            config.approve_tools,
        )
    )
    missing = set(config.tools) - {t.name for t in agent.tools}
    if missing:
        _usage_error(
            f"run {run_id} used tools the command line cannot rebuild "
            f"({', '.join(sorted(missing))}); resume it from your program with Agent.resume"
        )
    _finish(agent, lambda: agent.start_resume(run_id), as_json)


@app.command()
def approve(
    run_id: Annotated[str, typer.Argument(help="The paused run.")],
    call_id: Annotated[str | None, typer.Argument(help="The call to approve.")] = None,
    all_calls: Annotated[bool, typer.Option("--all", help="Approve every pending call.")] = False,
    by: ByOption = None,
    store: StoreOption = None,
) -> None:
    """Approve a pending call (or all with --all); `keel resume` then runs it."""
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
    err.print(f"continue with: keel resume {run_id}", highlight=False)


@app.command()
def deny(
    run_id: Annotated[str, typer.Argument(help="The paused run.")],
    call_id: Annotated[str, typer.Argument(help="The call to deny.")],
    reason: Annotated[str, typer.Option(help="Why; the model is told.")],
    by: ByOption = None,
    store: StoreOption = None,
) -> None:
    """Deny a pending call; the model hears who denied it and why, and not to retry it."""
    db = _open_store(store)
    try:
        _guard(lambda: approvals.deny(db, run_id, call_id, reason, by))
    finally:
        db.close()
    typer.echo(f"denied {call_id}")
    err.print(f"continue with: keel resume {run_id}", highlight=False)


@app.command()
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
        if sampling is not None:
            shown["sampling"] = sampling
        typer.echo(json.dumps(shown, ensure_ascii=False))
        return
    out = Console()
    summary = run_json(record)
    out.print(f"[bold]{record.run_id}[/bold] · {summary['status']} · model {record.model}")
    if isinstance(sampling, dict):
        pinned = ", ".join(f"{k} {v}" for k, v in sampling.items())
        out.print(f"sampling: {pinned}", highlight=False, markup=False)
    out.print(f"question: {record.question}", highlight=False, markup=False)
    out.print(timeline(events))
    if summary["answer"]:
        out.print(f"\nanswer: {summary['answer']}", highlight=False, markup=False)


@app.command()
def runs(
    store: StoreOption = None,
    limit: Annotated[int, typer.Option(help="How many runs to list.")] = 20,
) -> None:
    """List recent runs, newest first."""
    db = _open_store(store, read_only=True)
    try:
        records = _guard(lambda: db.list_runs(limit))
    finally:
        db.close()
    for r in records:
        typer.echo(
            f"{r.run_id}  {r.status:<17} {r.state.model_calls:>3} model "
            f"{r.state.tool_calls:>4} tools  {r.question[:70]}"
        )


app.command("eval")(eval_command)


@app.command()
def models() -> None:
    """List the model specs Keel can use here, and which one a run would use by default."""
    choice = _guard(lambda: choose_model())
    for spec, usable, note in available_models():
        mark = "yes" if usable else "no "
        typer.echo(f"{mark}  {spec:<22} {note}")
    typer.echo(f"\ndefault: {choice.spec} ({choice.source})")


# -- helpers ---------------------------------------------------------------------------------


def _agent(
    model: str,
    settings: JsonObject,
    limits: Limits,
    store: Store | Path | None,
    quiet: bool,
    system_prompt: str = DEFAULT_SYSTEM_PROMPT,
    approve_tools: Collection[str] = (),
) -> Agent:
    repo = Path(str(settings.get("repo", ".")))
    if not repo.is_dir():
        raise ConfigError(f"--repo {repo} is not a folder")
    allow_hosts = [str(h) for h in cast(list[str], settings.get("allow_hosts") or [])]
    tools: list[Tool] = [*file_tools(repo), *web_tools(allow_hosts=allow_hosts)]
    if settings.get("allow_writes"):
        tools += write_tools(repo)
    if settings.get("browser"):
        from keel.tools.browser import browser_tools

        tools += browser_tools(allow_hosts=allow_hosts)
    return Agent(
        model,
        base_url=_text(settings.get("base_url")),
        tools=tools,
        limits=limits,
        system_prompt=system_prompt,
        store=store or default_store_path(),
        listeners=() if quiet else (ProgressPrinter(err),),
        approve_tools=approve_tools,
        run_config={
            k: settings.get(k)
            for k in ("repo", "allow_hosts", "allow_writes", "base_url", "browser")
        },
    )


def _text(value: JsonValue) -> str | None:
    return None if value is None else str(value)


def _finish(agent: Agent, start: Callable[[], RunHandle], as_json: bool) -> NoReturn:
    with agent:
        if not as_json:
            watch_local_model(agent, err)
        result = _guard(lambda: asyncio.run(_with_signals(start)))
        summary = one_line(result, agent.store.events(result.run_id))
        show = show_command(result.run_id, agent.store.path, default_store_path())
    _print_result(result, as_json)
    if not as_json:
        err.print(f"{summary}\nopen it with: {show}", highlight=False, markup=False)
    raise typer.Exit(EXIT_CODES[result.status])


async def _with_signals(start: Callable[[], RunHandle]) -> RunResult:
    """Ctrl-C or SIGTERM cancels the run cooperatively; the store keeps what happened."""
    handle = start()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, handle.cancel)
    try:
        return await handle
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def _print_result(result: RunResult, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(result.to_dict(), ensure_ascii=False))
        return
    if result.answer is not None:
        typer.echo(result.answer)
    status: str = result.status
    if result.synthesized:
        status += f" (synthesized: {result.synthesized})"
    if result.cut_off:
        status += " (the answer was cut off at the model's output limit)"
    if result.failure:
        status += f": {result.failure.kind}: {result.failure.message}"
    for pending in result.pending_approvals:
        err.print(
            f"awaiting approval: {pending.call_id} {pending.call_key[:100]}\n"
            f"  keel approve {result.run_id} {pending.call_id}   or   "
            f"keel deny {result.run_id} {pending.call_id} --reason TEXT",
            highlight=False,
            markup=False,
        )
    err.print(
        f"{status} · run {result.run_id} · {result.model_calls} model calls · "
        f"{result.tool_calls} tool calls · {result.usage.input_tokens}+"
        f"{result.usage.output_tokens} tokens",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )


def _open_store(path: Path | None, *, read_only: bool = False) -> Store:
    """An existing store; `read_only` for the commands that only look (`runs`, `show`): they
    never write to it, not even a schema upgrade, and work on a read-only file or folder."""
    target = path or default_store_path()
    if not target.exists():
        _usage_error(f"no store at {target} (run `keel run` first)")
    return _guard(lambda: Store(target, read_only=read_only))


def _known_run(db: Store, run_id: str) -> Any:
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
        _usage_error(str(exc))


def _usage_error(message: str) -> NoReturn:
    err.print(f"keel: {message}", highlight=False, markup=False, soft_wrap=True)
    raise typer.Exit(2)


def main() -> None:
    try:
        app()
    except ConfigError as exc:
        err.print(f"keel: {exc}", highlight=False, markup=False)
        sys.exit(2)
