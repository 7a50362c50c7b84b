"""A local full-text index of a folder of documents, for `web_search` without the internet.

`keel index DIR` builds it and refreshes it: SQLite's FTS5 engine (stdlib `sqlite3`; a Python
whose SQLite lacks FTS5 is refused with what to do), one file ``DIR/.keel-index.sqlite``. A
refresh reads only the files whose size or modification time changed since the last one, and
drops the rows of files that are gone. Text, Markdown and reStructuredText are read as they
are, HTML through html2text (as `fetch` reads a page), PDF through pypdf when it is installed.
Hidden files and folders are skipped, links are not followed, and each file is read to a bound.

`--search local:DIR` answers a query from the index, best first by BM25 (a title counts more
than the body). Each hit's URL is the file's path relative to `--repo` when DIR is inside it,
so `read_file` opens it as it stands; otherwise a ``file://`` URL.
"""

from __future__ import annotations

import asyncio
import os
import re
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from keel.errors import ConfigError
from keel.tools.web_search import Hit, SearchError

__all__ = [
    "INDEX_FILE",
    "LocalIndexBackend",
    "Refreshed",
    "check_fts5",
    "refresh_index",
    "search_index",
]

INDEX_FILE = ".keel-index.sqlite"
MAX_FILE_BYTES = 20_000_000
"""A larger file is skipped: a corpus of notes and pages has none."""
MAX_TEXT_CHARS = 2_000_000
"""The most text of one file that is indexed."""
TEXT_SUFFIXES = frozenset({".txt", ".md", ".markdown", ".rst", ".text"})
HTML_SUFFIXES = frozenset({".html", ".htm", ".xhtml"})
_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    path TEXT PRIMARY KEY, size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL, doc INTEGER
);
CREATE VIRTUAL TABLE IF NOT EXISTS docs USING fts5(
    path UNINDEXED, title, body, tokenize = 'porter unicode61'
);
"""
_WORD = re.compile(r"\w+")
_HTML_TITLE = re.compile(r"<title[^>]*>(.*?)</title\s*>", re.IGNORECASE | re.DOTALL)


@dataclass(frozen=True, slots=True)
class Refreshed:
    """What one `keel index` did."""

    index: Path
    added: int
    updated: int
    removed: int
    unchanged: int
    skipped: list[str]
    """Files of a known kind that could not be read, each with the reason."""


def check_fts5() -> None:
    """Refuse a SQLite without the FTS5 engine, saying what to do."""
    try:
        with sqlite3.connect(":memory:") as db:
            db.execute("CREATE VIRTUAL TABLE probe USING fts5(x)")
    except sqlite3.OperationalError as exc:
        raise ConfigError(
            f"this Python's SQLite ({sqlite3.sqlite_version}) has no FTS5 full-text engine "
            f"({exc}); use a Python built with a current SQLite (python.org's, Debian's, uv's)"
        ) from None


def refresh_index(folder: str | os.PathLike[str]) -> Refreshed:
    """Build or bring up to date the index of `folder`; only changed files are read."""
    root = _folder(folder)
    check_fts5()
    index = root / INDEX_FILE
    db = sqlite3.connect(index)
    try:
        db.executescript(_SCHEMA)
        known = {p: (s, m, d) for p, s, m, d in db.execute("SELECT * FROM files")}
        counts = {"added": 0, "updated": 0, "unchanged": 0}
        skipped: list[str] = []
        seen: set[str] = set()
        for path, stat in _documents(root):
            rel = path.relative_to(root).as_posix()
            seen.add(rel)
            old = known.get(rel)
            if old is not None and old[:2] == (stat.st_size, stat.st_mtime_ns):
                counts["unchanged"] += 1
                continue
            try:
                title, body = read_document(path)
            except (OSError, ValueError) as exc:
                skipped.append(f"{rel}: {exc}")
                seen.discard(rel)  # an unreadable file's old text is not kept as if current
                continue
            with db:
                if old is not None and old[2] is not None:
                    db.execute("DELETE FROM docs WHERE rowid = ?", (old[2],))
                doc = db.execute(
                    "INSERT INTO docs (path, title, body) VALUES (?, ?, ?)", (rel, title, body)
                ).lastrowid
                db.execute(
                    "INSERT OR REPLACE INTO files VALUES (?, ?, ?, ?)",
                    (rel, stat.st_size, stat.st_mtime_ns, doc),
                )
            counts["updated" if old is not None else "added"] += 1
        gone = [(rel, entry[2]) for rel, entry in known.items() if rel not in seen]
        with db:
            for rel, doc in gone:
                db.execute("DELETE FROM docs WHERE rowid = ?", (doc,))
                db.execute("DELETE FROM files WHERE path = ?", (rel,))
    finally:
        db.close()
    return Refreshed(index, removed=len(gone), skipped=skipped, **counts)


def search_index(folder: str | os.PathLike[str], query: str, limit: int) -> list[tuple[str, Hit]]:
    """The best `limit` documents for `query`: (path relative to `folder`, hit with that path
    as its URL). Any word of the query may match; BM25 ranks, the title weighing five times
    the body, ties by path. The query's words are quoted, so no FTS5 syntax gets through."""
    root = _folder(folder)
    index = root / INDEX_FILE
    if not index.is_file():
        raise SearchError(f"{root} has no index: run keel index {root}")
    words = _WORD.findall(query)[:32]
    if not words:
        return []
    match = " OR ".join('"' + w.replace('"', '""') + '"' for w in words)
    db = sqlite3.connect(f"{index.as_uri()}?mode=ro", uri=True)
    try:
        rows = db.execute(
            "SELECT path, title, snippet(docs, 2, '', '', ' … ', 32) FROM docs "
            "WHERE docs MATCH ? ORDER BY bm25(docs, 0.0, 5.0, 1.0), path LIMIT ?",
            (match, limit),
        ).fetchall()
    except sqlite3.DatabaseError as exc:
        raise SearchError(
            f"the index of {root} could not be read ({exc}): run keel index again"
        ) from None
    finally:
        db.close()
    return [(path, Hit(title, path, snippet)) for path, title, snippet in rows]


class LocalIndexBackend:
    """`--search local:DIR`: the index `keel index DIR` built."""

    name = "local index"
    web = False

    def __init__(self, folder: str, *, repo: str | None = None) -> None:
        self.root = _folder(folder)
        check_fts5()
        if not (self.root / INDEX_FILE).is_file():
            raise ConfigError(f"--search local:{folder}: no index yet; run keel index {folder}")
        self.base: Path | None = None
        if repo is not None:
            repo_root = Path(repo).resolve()
            if self.root.is_relative_to(repo_root):
                self.base = repo_root

    async def search(self, query: str, limit: int) -> list[Hit]:
        found = await asyncio.to_thread(search_index, self.root, query, limit)
        return [Hit(hit.title, self._url(path), hit.snippet) for path, hit in found]

    def _url(self, rel: str) -> str:
        path = self.root / rel
        if self.base is not None:
            return path.relative_to(self.base).as_posix()
        return path.as_uri()


def read_document(path: Path) -> tuple[str, str]:
    """A document's title and text; ValueError for one that is not text."""
    suffix = path.suffix.lower()
    if suffix == ".pdf":
        return _read_pdf(path)
    raw = path.read_bytes()[:MAX_TEXT_CHARS * 2]
    if b"\x00" in raw[:8192]:
        raise ValueError("binary content")
    text = raw.decode("utf-8", errors="replace")
    if suffix in HTML_SUFFIXES:
        import html

        import html2text

        found = _HTML_TITLE.search(text)
        title = " ".join(html.unescape(found.group(1)).split()) if found else ""
        converter = html2text.HTML2Text(bodywidth=0)
        converter.ignore_images = True
        return title or path.stem, converter.handle(text)[:MAX_TEXT_CHARS]
    heading = re.search(r"^#\s+(.+)$", text, re.MULTILINE) if suffix != ".txt" else None
    return (heading.group(1).strip() if heading else path.stem), text[:MAX_TEXT_CHARS]


def _read_pdf(path: Path) -> tuple[str, str]:
    try:
        import pypdf
    except ImportError:
        raise ValueError("PDF needs pypdf: pip install 'keel-runtime[search]'") from None
    try:
        reader = pypdf.PdfReader(path)
        text = "\n".join(page.extract_text() or "" for page in reader.pages)
        title = str((reader.metadata.title if reader.metadata else None) or "").strip()
    except pypdf.errors.PyPdfError as exc:
        raise ValueError(f"not a readable PDF ({exc})") from None
    return title or path.stem, text[:MAX_TEXT_CHARS]


def _documents(root: Path) -> Iterator[tuple[Path, os.stat_result]]:
    """The files of a known kind under `root`, in path order, links and hidden names left out."""
    kinds = TEXT_SUFFIXES | HTML_SUFFIXES | {".pdf"}
    for here, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            path = Path(here) / name
            if name.startswith(".") or path.suffix.lower() not in kinds:
                continue
            stat = path.lstat()
            if path.is_symlink() or stat.st_size > MAX_FILE_BYTES:
                continue
            yield path, stat


def _folder(folder: str | os.PathLike[str]) -> Path:
    root = Path(folder).expanduser().resolve()
    if not root.is_dir():
        raise ConfigError(f"{folder} is not a folder")
    return root
