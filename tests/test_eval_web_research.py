"""`keel eval --suite web-research` (ADR 0061): a question answered from a corpus with
`web_search` then `fetch` (a SearXNG-shaped search page on the page server) or `read_file` (a
local FTS5 index of the scenario's files), each answer citing what was read."""

from __future__ import annotations

import json
from typing import Any
from urllib.request import urlopen

import pytest
import typer
from typer.testing import CliRunner

from keel.errors import ConfigError
from keel.evals import builtin_names
from keel.evals.command import eval_command
from keel.evals.loading import parse
from keel.evals.pageserver import PageServer

app = typer.Typer(add_completion=False)
app.callback()(lambda: None)
app.command("eval")(eval_command)


def test_the_web_research_suite_searches_reads_and_cites() -> None:
    assert builtin_names("web-research") == ["local_corpus", "search_then_fetch"]
    done = CliRunner().invoke(app, ["eval", "--suite", "web-research", "--json"])
    assert done.exit_code == 0, done.stdout
    report = json.loads(done.stdout)
    assert report["passed"] is True
    rows: dict[str, dict[str, Any]] = {s["name"]: s["results"][0] for s in report["scenarios"]}
    fetched = rows["search_then_fetch"]
    search, fetch = fetched["calls"]
    assert search == 'web_search {"query": "worker lease run expires"}'
    assert fetch.startswith('fetch {"url": "http://127.0.0.1:') and fetch.endswith('/docs/leases"}')
    assert fetched["page_hits"] == {
        "/search": 1, "/docs/leases": 1, "/blog/queues": 0, "/docs/store": 0,
    }  # fmt: skip
    assert fetched["evidence"]["quotes_checked"] == 1
    local = rows["local_corpus"]
    assert local["calls"][1] == 'read_file {"path": "corpus/release.md"}'
    assert local["evidence"]["quotes_checked"] == 1


def test_the_search_page_answers_searxng_json_for_the_words_of_the_query() -> None:
    results = [
        {"url": "http://x/a", "title": "Leases", "content": "a lease lasts 30 seconds"},
        {"url": "http://x/b", "title": "Queues", "content": "runs go to workers"},
    ]
    with PageServer() as server:
        server.add_searxng("/search", results)
        with urlopen(server.url("/search?q=lease+duration&format=json")) as answer:
            found = json.load(answer)
        assert [r["url"] for r in found["results"]] == ["http://x/a"]
        assert found["query"] == "lease duration" and found["number_of_results"] == 1
        assert {"answers", "corrections", "infoboxes", "suggestions", "unresponsive_engines"} \
            <= found.keys()  # fmt: skip
        with pytest.raises(Exception, match="403"):
            urlopen(server.url("/search?q=lease"))


def test_web_search_and_its_backend_are_named_together() -> None:
    base = {"question": "q?", "expect": {"status": "completed"}}
    with pytest.raises(ConfigError, match="web_search and search go together"):
        parse({**base, "tools": {"names": ["web_search"]}}, "t.toml", default_name="t")
    with pytest.raises(ConfigError, match="web_search and search go together"):
        parse({**base, "tools": {"search": "local:corpus"}}, "t.toml", default_name="t")
    with pytest.raises(ConfigError, match="search"):
        tavily = {"names": ["web_search"], "search": "tavily"}
        parse({**base, "tools": tavily}, "t.toml", default_name="t")
