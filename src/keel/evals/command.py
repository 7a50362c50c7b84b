"""`keel eval`: run evaluation scenarios and say whether the runtime's rules held.

Registered by the command line in one line, ``app.command("eval")(eval_command)``. Exit codes
follow `keel run`: 0 when every scenario passed, 1 when any failed, 2 for bad usage or a bad
scenario file (the message names the file and the field).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
from rich.console import Console

from keel.errors import ConfigError
from keel.evals.suites import BENCHMARK_SUITES, DEFAULT_SUITE, SUITES
from keel.models import SPEC_HELP

if TYPE_CHECKING:  # imported when the command runs: `keel --help` needs none (ADR 0042)
    from keel.evals.judging import RunRow, ScenarioReport
    from keel.evals.scenario import Scenario

__all__ = [
    "eval_command",
]


def eval_command(
    scenarios: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="[NAME|FILE|FOLDER]...",
            help="Built-in scenario names (of --suite), scenario files (.toml, .json) or "
            "folders of them [default: every scenario of --suite].",
            show_default=False,
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    model: Annotated[
        list[str] | None,
        typer.Option(
            help=f"Run against this model instead of each scenario's script: {SPEC_HELP}. "
            "With --fork, repeat it: each model is one row of the table, the first the baseline.",
            show_default=False,
        ),
    ] = None,
    fork_run: Annotated[
        str | None,
        typer.Option(
            "--fork",
            metavar="RUN",
            help="Compare models on one stored run's identical prefix: fork RUN at --at under "
            "each --model (--store: the store holding RUN [default: the user store]).",
            show_default=False,
        ),
    ] = None,
    at: Annotated[
        int | None,
        typer.Option("--at", help="With --fork: the last step copied.", show_default=False),
    ] = None,
    repeat: Annotated[
        int,
        typer.Option(min=1, help="Runs per scenario; the table counts how each run ended."),
    ] = 1,
    store: Annotated[
        Path | None,
        typer.Option(
            "--store",
            help="Keep the runs in this SQLite file, for `keel show` [default: in memory].",
            show_default=False,
        ),
    ] = None,
    suite: Annotated[
        str,
        typer.Option(
            help=f"Built-in suite: {', '.join([*SUITES, *BENCHMARK_SUITES])} (repo-questions: "
            "five questions about the repository at --repo, answers graded right, wrong or cut "
            "off against its code, needs --model; swe-qa: questions written by others, "
            "--questions, scored from the code, ADR 0068).",
        ),
    ] = DEFAULT_SUITE,
    repo: Annotated[
        Path | None,
        typer.Option(
            help="The repository repo questions read [default: the current folder]; for "
            "--questions FILE, a folder or a .tar.gz/.zip archive of it.",
            show_default=False,
        ),
    ] = None,
    list_only: Annotated[bool, typer.Option("--list", help="List the scenarios and exit.")] = False,
    questions: Annotated[
        list[Path] | None,
        typer.Option(
            help="SWE-QA questions (--suite swe-qa): a .jsonl file of question and reference "
            "answer (with --repo), or a folder of NAME.jsonl beside NAME-*.tar.gz.",
            show_default=False,
        ),
    ] = None,
    judge: Annotated[
        str | None,
        typer.Option(
            help="SWE-QA: also score each answer with this model as judge (the benchmark's "
            "five-dimension rubric; prompt and scores kept in --json) [default: no judge].",
            show_default=False,
        ),
    ] = None,
    plain_loop: Annotated[
        bool,
        typer.Option(
            "--plain-loop",
            help="SWE-QA: drive the model in a plain tool loop without Keel's rules (no "
            "steering, no synthesis turn), to measure what the runtime adds.",
        ),
    ] = False,
    answers: Annotated[
        Path | None,
        typer.Option(
            help="SWE-QA: append each scored answer to this JSON-lines file as it ends.",
            show_default=False,
        ),
    ] = None,
    timeout: Annotated[
        float | None,
        typer.Option(
            min=1,
            help="Seconds one run may take before it is cancelled as stuck "
            "[default: each scenario's own, 120]; a local model on a busy CPU needs more.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Run evaluation scenarios against the real runtime and report how each run ended.

    Each scenario serves its pages on 127.0.0.1, gives the agent real tools and a scripted
    model (or --model), and checks the outcome: status, failure kind, synthesis, call counts,
    page requests, evidence resets, elided results and the answer's text. Every run is graded
    right, wrong or cut off; an answer that repeats a synthesis control is wrong.
    """
    from keel.evals.loading import resolve
    from keel.evals.report import WIDE, print_grades, print_table, to_json

    err = Console(stderr=True, emoji=False)
    if suite == "swe-qa" or questions:
        from keel.evals.swe_qa.command import SweQaOptions, run_swe_qa

        if model and len(model) > 1:
            _usage_error(err, ConfigError("--model is given once, except with --fork"))
        options = SweQaOptions(
            questions or [], repo, scenarios or [], model[0] if model else None, judge,
            plain_loop, timeout, store, answers, as_json,
        )  # fmt: skip
        run_swe_qa(options, err)
    if fork_run is not None or at is not None:
        _compare_forks(fork_run, at, model or [], repeat, store, as_json, err)
    if model and len(model) > 1:
        _usage_error(err, ConfigError("--model is given once, except with --fork"))
    single = model[0] if model else None
    try:
        found = resolve(scenarios or [], suite)
        if timeout is not None:
            found = [
                dataclasses.replace(s, spec=s.spec.model_copy(update={"timeout": timeout}))
                for s in found
            ]
        if list_only:
            _list(found, as_json)
            return
        reports = _run(found, single, repeat, store, repo, None if as_json else err)
    except ConfigError as exc:
        _usage_error(err, exc)
    if as_json:
        typer.echo(json.dumps(to_json(reports, model=single, repeat=repeat), ensure_ascii=False))
    else:
        out = Console(emoji=False)
        if not out.is_terminal:
            out = Console(width=WIDE, emoji=False)
        print_table(reports, out)
        if any(r.scenario.spec.fact is not None for r in reports):
            print_grades(reports, out)
    raise typer.Exit(0 if all(r.passed for r in reports) else 1)


def _compare_forks(
    run_id: str | None,
    at: int | None,
    models: list[str],
    repeat: int,
    path: Path | None,
    as_json: bool,
    err: Console,
) -> NoReturn:
    """`--fork RUN --at STEP --model A --model B`: the comparison table (keel/evals/forks.py)."""
    import asyncio

    from keel.evals.forks import compare, print_comparison
    from keel.evals.forks import to_json as comparison_json
    from keel.store import Store
    from keel.store.locate import default_store_path

    if run_id is None or at is None:
        _usage_error(err, ConfigError("--fork RUN and --at STEP go together"))
    if not models:
        _usage_error(err, ConfigError("--fork needs at least one --model to fork onto"))
    db = Store(path or default_store_path())
    try:
        comparison = asyncio.run(compare(db, run_id, at, models, repeat))
    except ConfigError as exc:
        _usage_error(err, exc)
    finally:
        db.close()
    if as_json:
        typer.echo(json.dumps(comparison_json(comparison), ensure_ascii=False))
    else:
        from keel.evals.report import WIDE

        out = Console(emoji=False)
        print_comparison(comparison, out if out.is_terminal else Console(width=WIDE, emoji=False))
    raise typer.Exit(0)


def _run(
    found: list[Scenario],
    model: str | None,
    repeat: int,
    path: Path | None,
    repo: Path | None,
    err: Console | None,
) -> list[ScenarioReport]:
    import asyncio

    from keel.evals.runner import run_scenarios
    from keel.store import Store

    def progress(row: RunRow) -> None:
        if err is not None:
            verdict = "pass" if row.passed else "FAIL"
            err.print(
                f"{row.scenario} #{row.repeat}: {row.actual} · {row.grade} · {verdict} · "
                f"{row.seconds:.2f}s",
                highlight=False,
                markup=False,
                style="dim",
            )

    db = Store(":memory:" if path is None else path)
    try:
        return asyncio.run(
            run_scenarios(found, model=model, repeat=repeat, store=db, on_row=progress, repo=repo)
        )
    finally:
        db.close()


def _list(found: list[Scenario], as_json: bool) -> None:
    if as_json:
        items = [
            {"name": s.name, "source": s.source, "description": s.spec.description} for s in found
        ]
        typer.echo(json.dumps(items, ensure_ascii=False))
        return
    for s in found:
        typer.echo(f"{s.name:<22} {s.spec.description}")


def _usage_error(err: Console, exc: ConfigError) -> NoReturn:
    err.print(f"keel: {exc}", highlight=False, markup=False, soft_wrap=True)
    raise typer.Exit(2)
