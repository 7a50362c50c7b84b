"""`keel index DIR`: build or refresh the local full-text index that `--search local:DIR` reads
(`keel.tools.local_index`); the index module is imported when the command runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from keel.cli.common import guard, json_errors
from keel.present.terminal import safe_text

__all__ = ["index_command"]


@json_errors
def index_command(
    folder: Annotated[Path, typer.Argument(help="The folder of documents to index.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print what was done as JSON.")] = False,
) -> None:
    """Index the text, Markdown, HTML (and, with pypdf, PDF) files under FOLDER for
    `--search local:FOLDER`. Run it again after the files change: only changed files are read.

    The index is one SQLite FTS5 file, FOLDER/.keel-index.sqlite; hidden files and links are
    left out."""
    from keel.tools.local_index import refresh_index

    done = guard(lambda: refresh_index(folder))
    if as_json:
        fields = ("added", "updated", "removed", "unchanged", "skipped")
        report = {"index": str(done.index), **{k: getattr(done, k) for k in fields}}
        typer.echo(json.dumps(report, ensure_ascii=False))
        return
    typer.echo(
        f"indexed {safe_text(str(done.index))}: {done.added} added, {done.updated} updated, "
        f"{done.removed} removed, {done.unchanged} unchanged"
    )
    for line in done.skipped:
        typer.echo(f"skipped {safe_text(line)}", err=True)
    typer.echo(f"use it with: keel run --search local:{safe_text(str(folder))} QUESTION")
