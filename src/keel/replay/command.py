"""`keel replay`: recorded tool-call sequences through Keel's real run loop, and the tables.

Registered by the command line in one line, ``app.command("replay")(replay_command)``.
Inputs: files in the `shared/trajectories` format (JSON lines, gzipped or not), OpenAI Chat
Completions message lists, OpenTelemetry GenAI or OpenAI Agents SDK traces, Claude Code sessions,
OpenHands event logs (told apart by their content, or named with `--format`), or Keel's own
stored runs (`--store`, with `--run` ids or all). With `--window` (or `--window-of`), a second
table says where the recorded runs' requests would have passed that window (`keel.replay.window`).
Exit codes: 0 when everything given was replayed, 2 for bad usage or a file that cannot be
opened; lines that cannot be read are reported with their line number and skipped.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn, TypeVar

import typer
from rich.console import Console

from keel.errors import ConfigError, KeelError
from keel.limits import LOOP_POLICIES, REPEAT_TIERS, Limits

if TYPE_CHECKING:  # imported when the command runs: `keel --help` needs none (ADR 0042)
    from keel.limits import LoopPolicy, RepeatTier
    from keel.replay.playback import EffectChoice, Replayed
    from keel.replay.recordings import Format, Recording, Skipped
    from keel.replay.window import WindowCheck
    from keel.store import RunStore

__all__ = ["replay_command"]

_err = Console(stderr=True, emoji=False)
C = TypeVar("C", bound=str)


def replay_command(
    files: Annotated[
        list[Path] | None,
        typer.Argument(
            metavar="[FILE]...",
            help="Recorded runs: trajectories JSON lines (.jsonl, .jsonl.gz), OpenAI chat "
            "message lists, OTel GenAI / OpenAI Agents SDK traces, Claude Code sessions, "
            "OpenHands event logs (.json, .jsonl, or an events/ folder), SWE-agent .traj or "
            "mini-swe-agent .traj.json files, NeMo Gym rollouts (.jsonl) [default: the runs "
            "of --store].",
            show_default=False,
        ),
    ] = None,
    file_format: Annotated[
        str,
        typer.Option(
            "--format",
            help="The files' format: auto (told apart by their content), trajectories, chat, "
            "otel, claude-code, openhands, swe-agent or nemo-gym.",
        ),
    ] = "auto",
    store: Annotated[
        str | None,
        typer.Option(help="Replay Keel's own stored runs from this SQLite file or URL."),
    ] = None,
    run: Annotated[
        list[str] | None,
        typer.Option("--run", help="With --store: only this run (repeatable) [default: all]."),
    ] = None,
    threshold: Annotated[
        int, typer.Option("--threshold", help="Identical-call limit T (>= 2).")
    ] = 5,
    loop_policy: Annotated[
        str,
        typer.Option(help=f"How identical calls count: {' or '.join(LOOP_POLICIES)}."),
    ] = "progress",
    reset_cap: Annotated[int, typer.Option(help="Evidence resets per call key (R).")] = 3,
    tiers: Annotated[
        str,
        typer.Option(
            "--tiers",
            help="Repeat tiers in force: policy (as --loop-policy has them), none, or names "
            "joined by commas (same_result, alternation, same_error).",
        ),
    ] = "policy",
    effects: Annotated[
        str,
        typer.Option(
            help="A recorded call's effect when the recording declares none: kind (read/nav "
            "calls read, others may change things), read_only, or side_effecting."
        ),
    ] = "kind",
    nudge: Annotated[
        bool,
        typer.Option(
            "--nudge/--no-nudge",
            help="Give the nudge at T-2 (counted: the recording cannot answer it).",
        ),
    ] = False,
    window: Annotated[
        str | None,
        typer.Option(
            "--window",
            metavar="TOKENS",
            help="Also say where each run's requests would have passed a context window of "
            "this many tokens (prompt and answer), with nothing elided and with Keel's elision.",
            show_default=False,
        ),
    ] = None,
    window_of: Annotated[
        str | None,
        typer.Option(
            "--window-of",
            metavar="MODEL",
            help="The same, with this model's window from Keel's table (openai:gpt-4o); with "
            "--window, that window and this model's room for the answer.",
            show_default=False,
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="One JSON object per replayed run, one per line.")
    ] = False,
) -> None:
    """Replay recorded runs through the run loop: where the synthesis turn and the hard limit
    would have come, per run and per corpus; with --window, where the requests would have
    passed a context window."""
    import asyncio

    from keel.present.terminal import safe_text
    from keel.replay.playback import EFFECT_CHOICES
    from keel.replay.recordings import FORMATS
    from keel.replay.report import rows, table, window_rows, window_table
    from keel.replay.window import fit

    if not files and store is None:
        _usage("give recorded run files, or --store to replay Keel's own runs")
    if run and store is None:
        _usage("--run picks runs of a store: give --store too")
    policy = _choice(loop_policy, LOOP_POLICIES, "--loop-policy")
    effect = _choice(effects, EFFECT_CHOICES, "--effects")
    chosen_format = _choice(file_format, FORMATS, "--format")
    chosen = _tiers(tiers)
    check, source = _window(window, window_of)
    try:
        Limits(loop_threshold=threshold, evidence_reset_cap=reset_cap, loop_policy=policy)
    except ConfigError as exc:
        _usage(str(exc))
    skipped: list[Skipped] = []
    opened: RunStore | None = None
    try:
        if store is not None:
            opened = _open(store)
        recordings = list(_recordings(files or [], opened, run, skipped, chosen_format))
        replayed = asyncio.run(
            _replay_all(
                recordings, threshold, policy, effect, reset_cap, chosen, nudge, not as_json
            )
        )
    except (ConfigError, KeelError) as exc:
        _usage(str(exc))
    finally:
        if opened is not None:
            opened.close()
    for where in skipped:
        _err.print(
            safe_text(f"keel replay: skipped {where.where}: {where.reason}"),
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    fits = [fit(item.recording, check) for item in replayed] if check is not None else []
    if as_json:
        for n, item in enumerate(replayed):
            found = item.to_json()
            if fits:
                found["window"] = fits[n].to_json()
            typer.echo(json.dumps(found, ensure_ascii=False))
        return
    in_force = replayed[0].tiers if replayed else ()
    title = (
        f"policy {policy}, T = {threshold}, R = {reset_cap}, effects {effects}, "
        f"tiers {', '.join(in_force) or 'none'}"
    )
    out = Console(width=None if sys.stdout.isatty() else 160, emoji=False)
    out.print(table(rows(replayed), title))
    if check is not None:
        pairs = [(item.recording, found) for item, found in zip(replayed, fits, strict=True)]
        out.print(window_table(window_rows(pairs), check, source))


def _recordings(
    files: list[Path],
    store: RunStore | None,
    run_ids: list[str] | None,
    skipped: list[Skipped],
    file_format: Format,
) -> Iterator[Recording]:
    from keel.replay.openhands import is_events_file, read_events, read_folder
    from keel.replay.recordings import read_file, read_store

    folders: dict[Path, list[Path]] = {}  # an OpenHands events/ folder's files: one run
    for path in files:
        if path.is_dir():
            yield from read_folder(path, skipped)
        elif not path.is_file():
            raise ConfigError(f"no such file: {path}")
        elif file_format in ("auto", "openhands") and is_events_file(path):
            folders.setdefault(path.parent, []).append(path)
        else:
            yield from read_file(path, skipped, format=file_format)
    for group in folders.values():
        yield from read_events(group, skipped)
    if store is not None:
        yield from read_store(store, run_ids)


async def _replay_all(
    recordings: list[Recording],
    threshold: int,
    policy: LoopPolicy,
    effects: EffectChoice,
    reset_cap: int,
    tiers: tuple[RepeatTier, ...] | None,
    nudge: bool,
    show_progress: bool,
) -> list[Replayed]:
    from rich.progress import Progress

    from keel.replay.playback import replay

    out = []
    shown = show_progress and _err.is_terminal
    with Progress(console=_err, transient=True, disable=not shown) as bar:
        task = bar.add_task("replaying", total=len(recordings))
        for recording in recordings:
            out.append(
                await replay(
                    recording,
                    threshold=threshold,
                    policy=policy,
                    effects=effects,
                    reset_cap=reset_cap,
                    tiers=tiers,
                    nudge=nudge,
                )
            )
            bar.advance(task)
    return out


def _tiers(given: str) -> tuple[RepeatTier, ...] | None:
    """`--tiers`: None for the policy's own, else the named tiers."""
    if given == "policy":
        return None
    if given == "none":
        return ()
    chosen = []
    for name in (part.strip() for part in given.split(",")):
        chosen.append(_choice(name, REPEAT_TIERS, "--tiers"))
    return tuple(dict.fromkeys(chosen))


def _window(given: str | None, model: str | None) -> tuple[WindowCheck | None, str]:
    """`--window` and `--window-of`: the window to check, and where it comes from in words."""
    from keel.replay.window import WindowCheck
    from keel.windows import window_for

    if given is None and model is None:
        return None, ""
    if model is not None and not model.strip():
        _usage("--window-of needs a model spec, such as openai:gpt-4o")
    tokens = None
    if given is not None:
        try:
            tokens = int(given.strip())
        except ValueError:
            _usage(f"--window must be a whole number of tokens, not {given!r}")
        try:
            Limits(context_window=tokens)
        except ConfigError as exc:
            _usage(f"--window: {exc}")
    found = window_for(model or "", tokens)
    parts = [f"--window-of {model}"] if model else []
    named = " ".join([*parts, f"--window {tokens}"] if tokens else parts)
    if tokens is None:  # the table's window, or the default for a model Keel does not know
        named = f"{named}: {found.source}"
    return WindowCheck(found), named


def _open(given: str) -> RunStore:
    from keel.store import Store, open_store, store_target

    target = store_target(given)
    if isinstance(target, Path):
        if not target.is_file():
            raise ConfigError(f"no store at {target}")
        return Store(target, read_only=True)
    return open_store(target)


def _choice(value: str, choices: tuple[C, ...], flag: str) -> C:
    for choice in choices:
        if value == choice:
            return choice
    _usage(f"{flag} must be one of {', '.join(choices)}, not {value!r}")


def _usage(message: str) -> NoReturn:
    _err.print(f"keel replay: {message}", markup=False, highlight=False, soft_wrap=True)
    sys.stdout.flush()
    raise typer.Exit(2)
