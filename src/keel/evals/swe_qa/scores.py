"""The deterministic scores of one SWE-QA answer, computed from the code when it is evaluated.

- `reference_named`: of the code names the reference answer gives that exist in the
  repository, the share the answer names (`keel.evals.swe_qa.names.named_in`);
- `invented`: of the code names the answer gives, the share the repository does not hold;
- `opened_cited`: whether the run read (read_file) a file the reference answer cites;
- `citations_pass`: where the answer cites results ([r1]) or quotes them, whether every id and
  quote checks against the run's results (ADR 0053); None when it cites nothing.

Each is None where it cannot apply (a reference that cites no file, an answer that names no
code), and a table's share counts only the answers it applies to. The reference's names the
index cannot find are kept apart (`reference_unknown`): they measure the scorer's own reach.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from keel.evals.swe_qa.names import CodeName, RepoIndex, code_names, named_in

__all__ = ["score_answer"]


def score_answer(
    answer: str | None,
    reference: str,
    index: RepoIndex,
    opened: Sequence[str],
    evidence: dict[str, Any] | None,
) -> dict[str, Any]:
    """The four scores, and the names behind them so a reader can check each."""
    text = answer or ""
    wanted = code_names(reference)
    real = [n for n in wanted if index.exists(n)]
    given = code_names(text)
    paths = [n.text for n in given if n.kind == "path"]
    named = [n for n in real if named_in(text, n, paths)]
    invented = [n for n in given if not index.exists(n)]
    return {
        "reference_named": _share(len(named), len(real)),
        "invented": _share(len(invented), len(given)),
        "opened_cited": _opened_cited(real, opened, index),
        "citations_pass": _citations(evidence),
        "reference_names": [n.text for n in real],
        "reference_unknown": [n.text for n in wanted if n not in real],
        "named": [n.text for n in named],
        "answer_names": len(given),
        "invented_names": [n.text for n in invented],
    }


def _share(part: int, whole: int) -> float | None:
    return None if whole == 0 else round(part / whole, 3)


def _opened_cited(real: list[CodeName], opened: Sequence[str], index: RepoIndex) -> bool | None:
    cited = {index.file_for(n.text) for n in real if n.kind == "path"} - {None}
    if not cited:
        return None
    return any(index.file_for(path) in cited for path in opened)


def _citations(evidence: dict[str, Any] | None) -> bool | None:
    if not evidence:
        return None
    cites = evidence.get("cited") or evidence.get("unknown_ids") or evidence.get("quotes")
    return bool(evidence.get("passed")) if cites else None
