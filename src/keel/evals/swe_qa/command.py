"""`keel eval --suite swe-qa`: questions written by others, answered over their repository.

`keel.evals.command` hands over here when the suite is ``swe-qa`` or ``--questions`` is given.
The question files, the repositories and what to run come from the command line; each answer
is scored as it ends (`keel.evals.swe_qa.scores`), printed as a progress line, appended to
``--answers FILE`` when named (a long run keeps what it did if it is stopped), and summed up in
one table per repository, model and loop, or one JSON object.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import typer
from rich.console import Console

from keel.errors import ConfigError
from keel.evals.swe_qa.archive import Question, load_questions, open_repository, pair_folder
from keel.evals.swe_qa.names import RepoIndex
from keel.evals.swe_qa.running import Answered

__all__ = ["SweQaOptions", "run_swe_qa", "select"]

DEFAULT_TIMEOUT = 600.0


@dataclass(frozen=True, slots=True)
class SweQaOptions:
    """What `keel eval --suite swe-qa` was asked for."""

    questions: list[Path]
    repo: Path | None
    names: list[str]
    model: str | None
    judge: str | None
    plain: bool
    timeout: float | None
    store: Path | None
    answers: Path | None
    as_json: bool


def select(pairs: list[tuple[Path, Path]], names: list[str]) -> list[tuple[Question, Path]]:
    """The questions of every (file, repository) pair, kept to `names` when any are given:
    a question's name (``flask-03``) or a file's stem (``flask``)."""
    chosen: list[tuple[Question, Path]] = []
    for path, repo in pairs:
        chosen += [(q, repo) for q in load_questions(path)]
    if names:
        unknown = set(names) - {q.name for q, _ in chosen} - {p.stem for p, _ in pairs}
        if unknown:
            raise ConfigError(f"no such question or file: {', '.join(sorted(unknown))}")
        chosen = [(q, r) for q, r in chosen if q.name in names or q.name.rsplit("-", 1)[0] in names]
    return chosen


def _pairs(options: SweQaOptions) -> list[tuple[Path, Path]]:
    if not options.questions:
        raise ConfigError(
            "--suite swe-qa needs --questions: a SWE-QA .jsonl file (with --repo, a folder or a "
            ".tar.gz of the repository) or a folder of NAME.jsonl files beside their NAME-*.tar.gz"
        )
    pairs: list[tuple[Path, Path]] = []
    for given in options.questions:
        if given.is_dir():
            pairs += pair_folder(given)
        elif options.repo is None:
            raise ConfigError(f"--questions {given}: name its repository with --repo")
        else:
            pairs.append((given, options.repo))
    return pairs


def run_swe_qa(options: SweQaOptions, err: Console) -> None:
    """Run, score, print; exits 0 (a benchmark has no pass mark), 2 on bad usage."""
    from keel.evals.swe_qa.report import print_rows, to_json
    from keel.evals.swe_qa.scores import score_answer

    try:
        chosen = select(_pairs(options), options.names)
        opened = {repo: open_repository(repo) for repo in {r for _, r in chosen}}
    except ConfigError as exc:
        err.print(f"keel: {exc}", highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(2) from None
    indexes = {repo: RepoIndex.build(folder) for repo, folder in opened.items()}
    work = [(q, opened[r], indexes[r]) for q, r in chosen]
    by_name = {q.name: index for q, _, index in work}

    def scored(row: Answered) -> None:
        row.scores = score_answer(
            row.answer, row.reference, by_name[row.name], row.opened, row.evidence
        )
        s = row.scores
        err.print(
            f"{row.name}: {row.end} · named {s['reference_named']} · invented {s['invented']}"
            f" · opened cited {s['opened_cited']} · {row.model_calls} calls · {row.seconds:.1f}s",
            highlight=False, markup=False, style="dim",
        )  # fmt: skip
        if options.answers is not None:
            with options.answers.open("a", encoding="utf-8") as f:
                f.write(json.dumps(row.to_dict(), ensure_ascii=False) + "\n")

    rows = asyncio.run(_run(options, work, scored))
    if options.as_json:
        typer.echo(json.dumps(to_json(rows, options.judge), ensure_ascii=False))
    else:
        print_rows(rows, Console(width=200, emoji=False))
    raise typer.Exit(0)


async def _run(
    options: SweQaOptions,
    work: list[tuple[Question, Path, RepoIndex]],
    on_row: Callable[[Answered], None],
) -> list[Answered]:
    """The runs, on one loaded model (or each question's scripted reference run), then the
    judge's scores when one is named."""
    from keel.evals.swe_qa.running import run_questions
    from keel.models import resolve_model
    from keel.store import Store

    transport = None if options.model is None else resolve_model(options.model)
    prepare = getattr(transport, "prepare", None)
    if callable(prepare):  # the model loads before the first question's clock starts
        await asyncio.to_thread(prepare)
    db = Store(":memory:" if options.store is None else options.store)
    try:
        rows = await run_questions(
            work,
            model=options.model,
            transport=transport,
            store=db,
            timeout=options.timeout or DEFAULT_TIMEOUT,
            plain=options.plain,
            on_row=on_row,
        )
        if options.judge is not None:
            from keel.evals.swe_qa.judge import judge_rows

            await judge_rows(options.judge, rows)
        return rows
    finally:
        db.close()
        close = getattr(transport, "close", None)
        if callable(close):
            close()
