"""`keel index DIR` and `--search local:DIR`: a real folder of documents in SQLite FTS5,
refreshed by size and modification time, searched through the `web_search` tool (ADR 0061)."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from keel.cli.app import app
from keel.errors import ConfigError
from keel.tools.local_index import (
    INDEX_FILE,
    LocalIndexBackend,
    check_fts5,
    refresh_index,
    search_index,
)
from keel.tools.search_backends import backend_from_spec
from keel.tools.web_search import search_tools


def pdf_with_text(text: str, title: str) -> bytes:
    """A one-page PDF whose page shows `text` in Helvetica, written by hand (offsets counted)."""
    stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode()
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        b"<< /Title (" + title.encode() + b") >>",
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for n, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % n + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R /Info 6 0 R >>\n" % (len(objects) + 1)
    out += b"startxref\n%d\n%%%%EOF\n" % xref
    return bytes(out)


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    docs = tmp_path / "repo" / "corpus"
    (docs / "guides").mkdir(parents=True)
    (docs / "guides" / "retries.md").write_text(
        "# Retrying requests\n\nUse exponential backoff with jitter between attempts.\n"
    )
    (docs / "notes.txt").write_text("Meeting notes: the store writes one transaction per step.\n")
    (docs / "page.html").write_text(
        "<html><head><title>Lease &amp; heartbeat</title></head><body><h1>Leases</h1>"
        "<p>One process advances a run; the lease expires if its holder dies.</p></body></html>"
    )
    (docs / "paper.pdf").write_bytes(pdf_with_text("Circuit breakers stop a loop", "Breakers"))
    (docs / ".hidden.md").write_text("# Secret\n\nexponential backoff hidden\n")
    (docs / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    (docs / "blob.txt").write_bytes(b"\x00\x01binary")
    return docs


def test_this_python_has_fts5() -> None:
    check_fts5()


def test_a_folder_is_indexed_and_searched_by_relevance(corpus: Path) -> None:
    done = refresh_index(corpus)
    assert (done.added, done.updated, done.removed, done.unchanged) == (4, 0, 0, 0)
    assert done.index == corpus / INDEX_FILE
    assert [s.split(":")[0] for s in done.skipped] == ["blob.txt"]
    found = search_index(corpus, "exponential backoff", 5)
    assert [path for path, _ in found] == ["guides/retries.md"]  # the hidden file left out
    _, hit = found[0]
    assert hit.title == "Retrying requests" and "jitter" in hit.snippet
    (path, page), *others = search_index(corpus, "who holds the lease?", 5)
    assert path == "page.html" and others  # any word may match; the best first
    assert page.title == "Lease & heartbeat" and "holder dies" in page.snippet
    [(path, paper)] = search_index(corpus, "circuit breakers", 5)
    assert (path, paper.title) == ("paper.pdf", "Breakers")


def test_a_refresh_reads_only_what_changed(corpus: Path) -> None:
    refresh_index(corpus)
    notes = corpus / "notes.txt"
    notes.write_text("Meeting notes: the store keeps an append-only event log.\n")
    os.utime(notes, ns=(1, 1))
    (corpus / "page.html").unlink()
    (corpus / "guides" / "more.md").write_text("# More\n\nappend-only logs again\n")
    done = refresh_index(corpus)
    assert (done.added, done.updated, done.removed, done.unchanged) == (1, 1, 1, 2)
    assert {p for p, _ in search_index(corpus, "append-only", 5)} == {"guides/more.md", "notes.txt"}
    assert search_index(corpus, "transaction", 5) == []
    (corpus / "guides" / "retries.md").write_bytes(b"\x00 no longer text")
    assert refresh_index(corpus).removed == 1  # its old text is not kept as if current
    assert search_index(corpus, "jitter", 5) == []
    assert search_index(corpus, "lease holder", 5) == []
    with sqlite3.connect(corpus / INDEX_FILE) as db:
        assert db.execute("SELECT count(*) FROM docs").fetchone() == (3,)


def test_query_syntax_from_the_model_is_only_words(corpus: Path) -> None:
    refresh_index(corpus)
    for query in ['"backoff', "backoff AND (jitter", "NEAR(backoff jitter)", "title:x*", "-"]:
        search_index(corpus, query, 5)  # never an FTS5 syntax error
    assert search_index(corpus, "?!", 5) == []


async def test_the_tool_gives_paths_read_file_opens_under_the_repo(corpus: Path) -> None:
    refresh_index(corpus)
    repo = corpus.parent
    [tool] = search_tools(backend_from_spec(f"local:{corpus}", repo=str(repo)))
    text = await tool.fn(query="jitter between attempts", max_results=3)
    assert "Search results (local index), 1 hit." in text
    assert "URL: corpus/guides/retries.md" in text
    outside = LocalIndexBackend(str(corpus), repo=str(corpus.parent.parent / "elsewhere"))
    [hit] = await outside.search("jitter", 3)
    assert hit.url == (corpus / "guides" / "retries.md").as_uri()


def test_a_folder_without_an_index_is_refused_with_the_command(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="run keel index"):
        backend_from_spec(f"local:{tmp_path}")
    with pytest.raises(ConfigError, match="not a folder"):
        backend_from_spec(f"local:{tmp_path / 'missing'}")


def test_keel_index_builds_and_reports(corpus: Path) -> None:
    runner = CliRunner()
    first = runner.invoke(app, ["index", str(corpus)])
    assert first.exit_code == 0, first.output
    assert "4 added, 0 updated, 0 removed, 0 unchanged" in first.output
    again = runner.invoke(app, ["index", str(corpus), "--json"])
    report = json.loads(again.stdout)
    assert (report["added"], report["unchanged"]) == (0, 4)
    missing = runner.invoke(app, ["index", str(corpus / "nope")])
    assert missing.exit_code == 2 and "not a folder" in missing.output
