"""A newcomer's questions, asked as a newcomer asks them (issue 45): `keel run QUESTION --repo R`
on the default model, with no key, and graded against answers written down before any run.

Three questions a user would ask about this repository, asked over a clean copy of it (its
files at HEAD, `git archive`) that has a `.venv` inside, as `make run` leaves one: the copy's
`.venv` holds Keel's run dependencies (anthropic, openai, numpy, pydantic, ...), copied from the
environment this script runs in. Two questions about another real repository, `psf/requests`
at the commit the SWE-QA benchmark pins (`shared/benchmarks/swe-qa`), whose questions and
reference answers others wrote: the first two of its questions that begin "Where is", in the
file's order (numbers 39 and 41). What a right answer must name is written below, read from
the code and from the benchmark's reference answers; nothing was changed after a run.

Each question's checker is groups of patterns: right when the answer matches every group,
partly when it matches some, wrong when none. Seconds are the wall time of the `keel run`
process (model load included).

    python benchmarks/newcomer_questions.py                       # the default model, `local`
    python benchmarks/newcomer_questions.py --model local:1.5b    # name one (an older Keel)
    python benchmarks/newcomer_questions.py --no-venv             # the copy without `.venv`

The Keel that runs is the one this interpreter imports (`PYTHONPATH` picks another tree). The
script uses the standard library only, so it runs the same against any Keel.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SWE_QA = ROOT.parent / "shared" / "benchmarks" / "swe-qa" / "requests-46e939b.tar.gz"
PROVIDER_KEYS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "KEEL_MODEL", "KEEL_STORE")


@dataclass(frozen=True)
class Question:
    name: str
    repo: str
    """"keel" (the copy of this repository) or "requests"."""
    text: str
    must_name: tuple[str, ...]
    """Regular expressions (case-insensitive); each is one thing a right answer names."""

    def grade(self, answer: str) -> str:
        found = sum(bool(re.search(p, answer, re.IGNORECASE)) for p in self.must_name)
        if found == len(self.must_name):
            return "right"
        return "partly" if found else "wrong"


QUESTIONS = (
    Question(
        "keel-loop-exception",
        "keel",
        "Which exception does Keel raise when the same tool call is repeated too many times, "
        "and in which file is it defined?",
        (r"ToolLoopDetected", r"errors\.py"),
    ),
    Question(
        "keel-choose-model",
        "keel",
        "How do I choose which model `keel run` uses without passing --model on the command "
        "line?",
        (r"KEEL_MODEL", r"keel\.toml"),
    ),
    Question(
        "keel-loop-threshold",
        "keel",
        "Where is the default value of the loop threshold set, and what is that value?",
        (r"limits\.py", r"\b5\b|\bfive\b"),
    ),
    Question(
        "requests-39-server",
        "requests",
        "Where is the Server class implementation located that TestTestServer depends on, and "
        "how does the context manager protocol in that implementation coordinate with the "
        "threading and socket lifecycle management demonstrated across the test methods?",
        (r"testserver/server\.py", r"\bThread\b", r"__enter__|__exit__|ready_event|stop_event"),
    ),
    Question(
        "requests-41-native-string",
        "requests",
        "Where is the to_native_string function implementation located that "
        "test_to_native_string delegates to for performing the actual string conversion logic?",
        (r"_internal_utils", r"requests/utils\.py|requests\.utils|\butils\.py"),
    ),
)


def clean_copy(source: Path, into: Path) -> Path:
    """This repository's files at HEAD, as a clone has them (no .venv, no caches)."""
    into.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(source), "archive", "HEAD"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def add_venv(repo: Path) -> int:
    """A `.venv` in `repo` as `make run` leaves one: a virtual environment whose
    site-packages hold copies of Keel's run dependencies (not the model's weight packages).
    Returns the number of files copied."""
    venv = repo / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (site,) = venv.glob("lib/python*/site-packages")
    copied = 0
    for dist in _run_dependencies():
        for file in dist.files or ():
            origin = Path(str(dist.locate_file(file)))
            if file.parts[0] == ".." or not origin.is_file():
                continue  # scripts outside site-packages, or files listed but absent
            target = site / file
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(origin, target)  # a copy: the tools skip hard-linked files
            copied += 1
    return copied


def _run_dependencies() -> list[importlib.metadata.Distribution]:
    """The installed distributions `keel-runtime[local]` needs to run (the weight packages
    aside), with their own dependencies."""
    seen: dict[str, importlib.metadata.Distribution] = {}
    pending = ["keel-runtime", "llama-cpp-python"]  # `local` extra: llama.cpp and numpy
    while pending:
        name = re.split(r"[\s<>=!~;\[(]", pending.pop(), maxsplit=1)[0].lower().replace("_", "-")
        if name in seen:
            continue
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        seen[name] = dist
        pending += [r for r in dist.requires or () if "extra ==" not in r]
    seen.pop("keel-runtime", None)
    return list(seen.values())


def requests_copy(into: Path, archive: Path) -> Path:
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into / "requests"


def ask(question: Question, repo: Path, model: str | None, data: Path) -> dict[str, object]:
    command = [sys.executable, "-m", "keel", "run", question.text, "--repo", str(repo)]
    command += ["--max-model-calls", "8", "--json"]
    if model:
        command += ["--model", model]
    env = {k: v for k, v in os.environ.items() if k not in PROVIDER_KEYS}
    env["XDG_DATA_HOME"] = str(data)
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=repo)
    seconds = time.monotonic() - started
    try:
        result = json.loads(done.stdout)
    except json.JSONDecodeError:
        result = {"status": f"no JSON (exit {done.returncode})", "answer": done.stderr[-300:]}
    answer = str(result.get("answer") or "")
    return {
        "question": question.name,
        "grade": question.grade(answer) if result.get("status") == "completed" else "wrong",
        "seconds": round(seconds),
        "status": result.get("status"),
        "tool_calls": result.get("tool_calls"),
        "synthesized": result.get("synthesized"),
        "answer": answer,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a model spec [default: none given: Keel's default]")
    parser.add_argument("--no-venv", action="store_true", help="no .venv in the copy")
    parser.add_argument("--swe-qa", type=Path, default=SWE_QA, help="requests' archive")
    parser.add_argument("--json", type=Path, help="also write the rows, answers included")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="keel-newcomer-") as folder:
        work = Path(folder)
        keel_repo = clean_copy(ROOT, work / "keel")
        venv_note = "no .venv" if args.no_venv else f".venv with {add_venv(keel_repo)} files"
        repos = {"keel": keel_repo, "requests": requests_copy(work, args.swe_qa)}
        rows = [ask(q, repos[q.repo], args.model, work / "data") for q in QUESTIONS]
    print(f"model: {args.model or 'the default (no --model)'}; this repository's copy: {venv_note}")
    print("| question | grade | seconds | tool calls | synthesized |")
    print("|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['question']} | {row['grade']} | {row['seconds']} | {row['tool_calls']} | "
            f"{row['synthesized'] or 'no'} |"
        )
    grades = [str(row["grade"]) for row in rows]
    print(f"\nright {grades.count('right')}, partly {grades.count('partly')}, "
          f"wrong {grades.count('wrong')} of {len(rows)}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
