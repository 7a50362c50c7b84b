"""The `keel` command: a thin layer over the library.

Exit codes: 0 completed, 1 failed or cancelled, 2 bad usage or configuration, 3 awaiting approval.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from keel.agent import Agent, default_store_path
from keel.errors import ConfigError
from keel.limits import Limits
from keel.models import SPEC_HELP
from keel.progress import ProgressPrinter
from keel.result import RunResult
from keel.store import Store
from keel.tools.files import file_tools
from keel.tools.web import web_tools

EXIT_CODES = {"completed": 0, "failed": 1, "cancelled": 1, "awaiting_approval": 3}

app = typer.Typer(
    help="Keel: an agent runtime for research runs that end with an answer, a classified "
    "failure, or a durable pause.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err = Console(stderr=True)

StoreOption = Annotated[
    Path | None,
    typer.Option("--store", help="SQLite file of runs [default: under the user data directory]"),
]


@app.command()
def run(
    question: Annotated[str, typer.Argument(help="What to research.")],
    model: Annotated[str | None, typer.Option(help=f"Model spec: {SPEC_HELP}.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    store: StoreOption = None,
    repo: Annotated[
        Path, typer.Option(help="Folder the file tools may read (nothing outside it).")
    ] = Path("."),
    allow_host: Annotated[
        list[str] | None,
        typer.Option(help="Let fetch reach this loopback/private host (repeatable)."),
    ] = None,
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
) -> None:
    """Run an agent on QUESTION with the research tools and print its answer."""
    try:
        if model is None:
            raise ConfigError(
                f"no model given: pass --model SPEC ({SPEC_HELP}); see examples/ for a script"
            )
        if not repo.is_dir():
            raise ConfigError(f"--repo {repo} is not a folder")
        limits = Limits(
            loop_threshold=loop_threshold,
            evidence_reset_cap=evidence_reset_cap,
            max_model_calls=max_model_calls,
            max_tool_calls=max_tool_calls,
            max_tokens=max_tokens,
            deadline=deadline,
            context_tokens=context_tokens,
        )
        tools = [*file_tools(repo), *web_tools(allow_hosts=allow_host or ())]
        listeners = () if as_json else (ProgressPrinter(err),)
        agent = Agent(
            model,
            tools=tools,
            limits=limits,
            store=store or default_store_path(),
            listeners=listeners,
        )
    except ConfigError as exc:
        _usage_error(exc)
    with agent:
        result = asyncio.run(_run_with_signals(agent, question))
    _print_result(result, as_json)
    raise typer.Exit(EXIT_CODES[result.status])


async def _run_with_signals(agent: Agent, question: str) -> RunResult:
    """Ctrl-C or SIGTERM cancels the run cooperatively; the store keeps what happened."""
    handle = agent.start(question)
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
    if result.failure:
        status += f": {result.failure.kind}: {result.failure.message}"
    err.print(
        f"[bold]{status}[/bold] · run {result.run_id} · {result.model_calls} model calls · "
        f"{result.tool_calls} tool calls · {result.usage.input_tokens}+"
        f"{result.usage.output_tokens} tokens",
        highlight=False,
        soft_wrap=True,
    )


@app.command()
def show(
    run_id: Annotated[str, typer.Argument(help="The run's id, as `keel runs` lists it.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    store: StoreOption = None,
) -> None:
    """Show a run and its events."""
    with _open_store(store) as db:
        record = db.get_run(run_id)
        if record is None:
            _usage_error(ConfigError(f"no run {run_id} in {db.path}"))
        events = db.events(run_id)
    run_json = _record_json(record.run_id, record.state)
    if as_json:
        typer.echo(json.dumps({"run": run_json, "events": events}, ensure_ascii=False))
        return
    out = Console()
    out.print(f"[bold]{record.run_id}[/bold] · {record.status} · model {record.model}")
    out.print(f"question: {record.question}", highlight=False)
    table = Table("seq", "step", "event", "detail", box=None, pad_edge=False)
    for event in events:
        table.add_row(str(event["seq"]), str(event.get("step", "")), event["type"], _summary(event))
    out.print(table)
    if run_json["answer"]:
        out.print(f"\nanswer: {run_json['answer']}", highlight=False)


@app.command()
def runs(
    store: StoreOption = None,
    limit: Annotated[int, typer.Option(help="How many runs to list.")] = 20,
) -> None:
    """List recent runs, newest first."""
    with _open_store(store) as db:
        records = db.list_runs(limit)
    for r in records:
        state = r.state
        typer.echo(
            f"{r.run_id}  {r.status:<17} {state.get('model_calls', 0):>3} model "
            f"{state.get('tool_calls', 0):>4} tools  {r.question[:70]}"
        )


class _open_store:
    def __init__(self, path: Path | None) -> None:
        target = path or default_store_path()
        if not target.exists():
            _usage_error(ConfigError(f"no store at {target} (run `keel run` first)"))
        self.store = Store(target)

    def __enter__(self) -> Store:
        return self.store

    def __exit__(self, *exc: object) -> None:
        self.store.close()


def _record_json(run_id: str, state: dict[str, Any]) -> dict[str, Any]:
    usage = state.get("usage", [0, 0, 0])
    failure = state.get("failure")
    return {
        "run_id": run_id,
        "status": state.get("status"),
        "answer": state.get("answer"),
        "synthesized": state.get("synthesized"),
        "failure": None if failure is None else {k: failure[k] for k in ("kind", "message")},
        "model_calls": state.get("model_calls", 0),
        "tool_calls": state.get("tool_calls", 0),
        "usage": {"input_tokens": usage[0], "output_tokens": usage[1]},
    }


def _summary(event: dict[str, Any]) -> str:
    t = event["type"]
    if t == "model_request":
        mode = f"synthesis={event['synthesis']}" if event["synthesis"] else "normal"
        return f"{mode} tool_choice={event['tool_choice']} ~{event['estimated_input_tokens']} tok"
    if t == "model_response":
        calls = ", ".join(c["name"] for c in event["tool_calls"])
        text = (event["text"] or "").replace("\n", " ")[:60]
        return f"calls: {calls}" if calls else ("(empty)" if event["empty"] else text)
    if t == "tool_call":
        return str(event["call_key"])[:90]
    if t == "tool_result":
        flags = [f for f in ("is_error", "truncated", "elided") if event.get(f)]
        return f"{event['name']} {event['size']} chars {' '.join(flags)}".strip()
    if t in ("run_failed", "model_error"):
        return f"{event.get('kind', event.get('status'))}: {event['message']}"[:120]
    if t == "result_elided":
        return f"{event['call_key'][:60]} ({event['size']} chars)"
    return ""


def _usage_error(exc: ConfigError) -> NoReturn:
    err.print(f"keel: {exc}", highlight=False, markup=False)
    raise typer.Exit(2)


def main() -> None:
    try:
        app()
    except ConfigError as exc:
        err.print(f"keel: {exc}", highlight=False, markup=False)
        sys.exit(2)
