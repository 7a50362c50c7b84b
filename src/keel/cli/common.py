"""What every `keel` command shares: the exit codes, the options several commands take, and
how misuse becomes one line on stderr and exit code 2 (with `--json`, one JSON object on stdout
too), never a traceback."""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar, cast

import typer
from rich.console import Console

from keel.errors import ConfigError, KeelError

if TYPE_CHECKING:  # imported where used: `keel --help` needs none of them (ADR 0042)
    from keel.durability import Durability
    from keel.records import JsonValue
    from keel.store import RunStore

__all__ = [
    "EXIT_CODES",
    "ApiKeyEnvOption",
    "BaseUrlOption",
    "ByOption",
    "DurabilityOption",
    "EventsOption",
    "JsonOption",
    "LoopPolicyOption",
    "OtelContentOption",
    "OtelOption",
    "StoreOption",
    "ToolChoiceOption",
    "err",
    "guard",
    "json_error",
    "json_errors",
    "known_run",
    "open_run_store",
    "resume_line",
    "text_of",
    "usage_error",
]

EXIT_CODES = {"completed": 0, "failed": 1, "cancelled": 1, "awaiting_approval": 3}

# emoji=False: untrusted text (a provider's error, a tool's name) prints as it came, ":smile:" too
err = Console(stderr=True, emoji=False)

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

JSON_ERRORS: ContextVar[bool] = ContextVar("keel_json_errors", default=False)
"""The command running now was given `--json`: its exit-2 errors go to stdout as JSON too."""

F = TypeVar("F", bound=Callable[..., Any])


def json_errors(command: F) -> F:
    """Let `command`'s ``as_json`` decide how its usage errors are written (`usage_error`)."""

    @functools.wraps(command)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        token = JSON_ERRORS.set(bool(kwargs.get("as_json")))
        try:
            return command(*args, **kwargs)
        finally:
            JSON_ERRORS.reset(token)

    return cast(F, wrapped)


def resume_line(run_id: str, db: RunStore) -> str:
    """`keel resume RUN_ID`, with `--store` when the run is not in the default store."""
    from keel.present.summary import resume_command
    from keel.store.locate import default_store_path

    return resume_command(run_id, db.path, default_store_path())


def text_of(value: JsonValue) -> str | None:
    return None if value is None else str(value)


def open_run_store(
    given: str | None, *, read_only: bool = False, durability: Durability = "process"
) -> RunStore:
    """An existing store; `read_only` for the commands that only look (`runs`, `show`): they
    never write to it, not even a schema upgrade, and work on a read-only file or folder."""
    from keel.store import Store, open_store, store_target

    target = guard(lambda: store_target(given))
    if isinstance(target, Path) and not target.exists():
        usage_error(f"no store at {target} (run `keel run` first)")
    if isinstance(target, Path):
        return guard(lambda: Store(target, read_only=read_only, durability=durability))
    return guard(lambda: open_store(target, read_only=read_only))


def known_run(db: RunStore, run_id: str) -> Any:
    record = db.get_run(run_id)
    if record is None:
        raise ConfigError(f"no run {run_id} in {db.path}")
    return record


T = TypeVar("T")


def guard(action: Callable[[], T]) -> T:
    """Misuse and refusals become a message and exit code 2, never a traceback."""
    try:
        return action()
    except (ConfigError, KeelError) as exc:
        usage_error(str(exc), type(exc).__name__)


def usage_error(message: str, kind: str = "UsageError") -> NoReturn:
    """One line on stderr, exit code 2; under `--json` also the error as one JSON object on
    stdout, so a program reading the JSON always has something to parse. `kind`: the error's
    class name (``ConfigError``, ``LeaseHeld``), like a failed run's ``failure.kind``."""
    err.print(f"keel: {message}", highlight=False, markup=False, soft_wrap=True)
    json_error(kind, message)
    raise typer.Exit(2)


def json_error(kind: str, message: str) -> None:
    if JSON_ERRORS.get():
        from keel.present.timeline import json_text

        typer.echo(json_text({"error": {"kind": kind, "message": message}}))
