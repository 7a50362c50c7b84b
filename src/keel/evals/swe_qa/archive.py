"""SWE-QA questions and the repository they are about, read safely from what a user names.

A question file is SWE-QA's format: one JSON object a line, with ``question`` and ``answer``
(the reference answer). The repository is a folder, or a ``.tar.gz``/``.tar``/``.zip``
archive (as ``git archive`` makes it), extracted once into a cache folder keyed by the
archive's digest. Both come from outside, so both are bounded: a question file of at most
`MAX_QUESTIONS_BYTES`, an archive whose members stay inside the folder (no absolute path, no
``..``, no link, no device), whose count and unpacked size are capped before anything is
written.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from keel.errors import ConfigError

__all__ = [
    "MAX_ARCHIVE_MEMBERS",
    "MAX_QUESTIONS_BYTES",
    "MAX_UNPACKED_BYTES",
    "Question",
    "load_questions",
    "open_repository",
    "pair_folder",
]

MAX_QUESTIONS_BYTES = 32 * 1024 * 1024
MAX_QUESTION_CHARS = 20_000
MAX_ARCHIVE_MEMBERS = 50_000
MAX_UNPACKED_BYTES = 512 * 1024 * 1024
"""The most an archive may unpack to: the two shared repositories unpack to 1-6 MB."""
_ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".zip")


@dataclass(frozen=True, slots=True)
class Question:
    """One benchmark question: its name (file stem and 1-based line), text and reference."""

    name: str
    question: str
    reference: str


def load_questions(path: Path) -> list[Question]:
    """The questions of a SWE-QA jsonl file, named ``STEM-NN``; a bad line is a ConfigError
    naming the file and the line."""
    try:
        if path.stat().st_size > MAX_QUESTIONS_BYTES:
            raise ConfigError(f"questions {path}: larger than {MAX_QUESTIONS_BYTES} bytes")
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"questions {path}: cannot read it: {exc}") from None
    found: list[Question] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"questions {path}:{number}: not valid JSON: {exc.msg}") from None
        if not isinstance(item, dict):
            raise ConfigError(f"questions {path}:{number}: each line is a JSON object")
        texts = [item.get(key) for key in ("question", "answer")]
        if not all(isinstance(t, str) and t.strip() for t in texts):
            raise ConfigError(
                f"questions {path}:{number}: needs the strings 'question' and 'answer'"
            )
        question, reference = (str(t)[:MAX_QUESTION_CHARS] for t in texts)
        found.append(Question(f"{path.stem}-{len(found) + 1:02d}", question, reference))
    if not found:
        raise ConfigError(f"questions {path}: no questions in it")
    return found


def pair_folder(folder: Path) -> list[tuple[Path, Path]]:
    """Each ``NAME.jsonl`` of a benchmark folder with its repository: the folder ``NAME/`` or
    the archive ``NAME-*.tar.gz`` (or .tgz, .tar, .zip) beside it, as the shared layout has."""
    pairs: list[tuple[Path, Path]] = []
    for questions in sorted(folder.glob("*.jsonl")):
        stem = questions.stem
        archives = [p for p in folder.glob(f"{stem}*") if p.name.endswith(_ARCHIVE_SUFFIXES)]
        candidates = [folder / stem, *sorted(archives)]
        repo = next((c for c in candidates if c.exists()), None)
        if repo is None:
            raise ConfigError(f"{questions}: no repository beside it ({stem}/ or {stem}-*.tar.gz)")
        pairs.append((questions, repo))
    if not pairs:
        raise ConfigError(f"{folder}: no .jsonl question files in it")
    return pairs


def open_repository(source: Path, cache: Path | None = None) -> Path:
    """The folder to run the file tools on: `source` itself, or its archive extracted (once,
    under `cache`, default the temporary folder) and, when the archive holds one top folder
    (``flask/``), that folder."""
    if source.is_dir():
        return source.resolve()
    if not source.name.endswith(_ARCHIVE_SUFFIXES):
        raise ConfigError(f"repository {source}: neither a folder nor a .tar.gz/.tar/.zip archive")
    digest = _digest(source)
    base = (cache or Path(tempfile.gettempdir()) / "keel-swe-qa").resolve()
    target = base / digest[:16]
    if not (target / ".complete").exists():
        base.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f"{digest[:8]}-", dir=base))
        try:
            _extract(source, staging)
            (staging / ".complete").write_text(source.name, encoding="utf-8")
            shutil.rmtree(target, ignore_errors=True)
            os.replace(staging, target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    tops = [p for p in target.iterdir() if p.name != ".complete"]
    return tops[0] if len(tops) == 1 and tops[0].is_dir() else target


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    try:
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    except OSError as exc:
        raise ConfigError(f"repository {path}: cannot read it: {exc}") from None
    return h.hexdigest()


def _safe_member(name: str, source: Path) -> PurePosixPath:
    """A member's path, refused when it would land outside the folder."""
    rel = PurePosixPath(name.replace("\\", "/"))
    if rel.is_absolute() or ".." in rel.parts or re.match(r"^[A-Za-z]:", name):
        raise ConfigError(f"repository {source}: member {name!r} points outside the folder")
    return rel


def _extract(source: Path, into: Path) -> None:
    """Regular files and folders only, each checked before it is written; links, devices and
    anything past the caps refuse the whole archive."""
    total = 0
    if source.name.endswith(".zip"):
        with zipfile.ZipFile(source) as archive:
            infos = archive.infolist()
            if len(infos) > MAX_ARCHIVE_MEMBERS:
                raise ConfigError(f"repository {source}: more than {MAX_ARCHIVE_MEMBERS} members")
            for info in infos:
                rel = _safe_member(info.filename, source)
                total += info.file_size
                _check_total(total, source)
                if info.is_dir():
                    (into / rel).mkdir(parents=True, exist_ok=True)
                    continue
                if (info.external_attr >> 16) & 0o170000 == 0o120000:
                    raise ConfigError(f"repository {source}: member {info.filename!r} is a link")
                _write(into / rel, archive.open(info).read())
        return
    try:
        with tarfile.open(source) as archive:
            count = 0
            for member in archive:
                count += 1
                if count > MAX_ARCHIVE_MEMBERS:
                    raise ConfigError(
                        f"repository {source}: more than {MAX_ARCHIVE_MEMBERS} members"
                    )
                if member.type == tarfile.XGLTYPE or member.name == "pax_global_header":
                    continue  # git archive's commit note, not a file
                rel = _safe_member(member.name, source)
                if member.isdir():
                    (into / rel).mkdir(parents=True, exist_ok=True)
                    continue
                if not member.isreg():
                    continue  # links, devices, fifos: never written
                total += member.size
                _check_total(total, source)
                data = archive.extractfile(member)
                if data is not None:
                    _write(into / rel, data.read())
    except tarfile.TarError as exc:
        raise ConfigError(f"repository {source}: not a readable archive: {exc}") from None


def _check_total(total: int, source: Path) -> None:
    if total > MAX_UNPACKED_BYTES:
        raise ConfigError(f"repository {source}: unpacks to more than {MAX_UNPACKED_BYTES} bytes")


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("xb") as f:  # never through a file or link already there
        f.write(data)
