"""Tables of SWE-QA runs for docs/evaluations.md, from the answers `keel eval --suite swe-qa
--answers FILE` kept (issue 51, ADR 0068).

Each answer is scored again with the scorers of this checkout (`keel.evals.swe_qa.scores`),
so runs made at different times are compared by one scorer; the answers themselves are as the
runs wrote them. Usage::

    python benchmarks/swe_qa_table.py --questions ../shared/benchmarks/swe-qa \
        "local, Keel=answers-a.jsonl" "local, plain loop=answers-b.jsonl" [--only NAMES_FILE]

`--common` keeps, per repository, only the questions every labelled file answered, so a
before/after row compares the same questions.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from keel.evals.swe_qa.archive import open_repository, pair_folder
from keel.evals.swe_qa.names import RepoIndex
from keel.evals.swe_qa.report import summary
from keel.evals.swe_qa.running import Answered
from keel.evals.swe_qa.scores import score_answer


def _load(path: Path) -> list[Answered]:
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        data = json.loads(line)
        rows.append(Answered(**data))
    return rows


def _share(figure: dict[str, object]) -> str:
    mean, count = figure["mean"], figure["of"]
    return "-" if mean is None else f"{mean:.2f} ({count})"


def _spread(figure: dict[str, float | None], digits: int = 0) -> str:
    if figure["median"] is None:
        return "-"
    return f"{figure['median']:.{digits}f} ({figure['min']:.{digits}f}-{figure['max']:.{digits}f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=Path, required=True)
    parser.add_argument("--common", action="store_true")
    parser.add_argument("runs", nargs="+", help="LABEL=ANSWERS.jsonl")
    args = parser.parse_args()
    indexes = {q.stem: RepoIndex.build(open_repository(r)) for q, r in pair_folder(args.questions)}
    runs = []
    for given in args.runs:
        label, _, file = given.rpartition("=")
        rows = _load(Path(file))
        for row in rows:
            index = indexes[row.name.rsplit("-", 1)[0]]
            row.scores = score_answer(row.answer, row.reference, index, row.opened, row.evidence)
        runs.append((label, rows))
    print(
        "| repository | run | questions | ref. names named | invented | opened a cited file "
        "| citations pass | at limits | model calls | read_file calls | tokens | seconds "
        "| total |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for stem in indexes:
        names = [{r.name for r in rows if r.name.startswith(stem + "-")} for _, rows in runs]
        common = set.intersection(*names) if args.common else None
        for label, rows in runs:
            mine = [r for r in rows if r.name.startswith(stem + "-")]
            if common is not None:
                mine = [r for r in mine if r.name in common]
            if not mine:
                continue
            s = summary(mine)
            print(
                f"| {stem} | {label} | {s['questions']} | {_share(s['reference_named'])} "
                f"| {_share(s['invented'])} | {_share(s['opened_cited'])} "
                f"| {_share(s['citations_pass'])} | {s['answers_at_limits']} "
                f"| {_spread(s['model_calls'])} | {_spread(s['read_file_calls'])} "
                f"| {_spread(s['tokens'])} | {_spread(s['seconds'], 1)} "
                f"| {s['total_seconds'] / 60:.0f} min |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
