"""What only the Postgres store has to prove: a bad URL is one clear line and exit code 2, and
the URL's password never reaches the store, its events or any output."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from keel.config import trust
from keel.records import RunConfig, RunStarted, RunState, ToolDispatched
from keel.store import Checkpoint
from keel.store.locate import redact, store_target
from keel.store.postgres_store import PostgresStore, _write_checkpoint
from postgres import PASSWORD, Cluster, free_port


def keel(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "keel", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def test_redact_hides_the_password_wherever_the_url_holds_it() -> None:
    assert redact("postgresql://ana:pw@db:5432/keel") == "postgresql://ana:***@db:5432/keel"
    assert redact("postgres://db/keel?user=ana&password=pw") == (
        "postgres://db/keel?user=ana&password=***"
    )
    assert redact("postgresql://db/keel") == "postgresql://db/keel"


def test_the_store_comes_from_the_option_then_keel_store_then_keel_toml(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    url = "postgresql://ana:pw@db/keel"
    assert store_target("x.sqlite", env={"KEEL_STORE": url}) == Path("x.sqlite")
    assert store_target(None, env={"KEEL_STORE": url}, cwd=tmp_path) == url
    (tmp_path / "keel.toml").write_text(f'store = "{url}"\n')
    trust(tmp_path)  # a working-directory keel.toml counts once trusted
    assert store_target(None, env={}, cwd=tmp_path) == url


@pytest.mark.parametrize("problem", ["unreachable", "wrong password", "no such database"])
def test_a_bad_postgres_url_is_one_clear_line_and_exit_2(
    problem: str, postgres_cluster: Cluster, tmp_path: Path
) -> None:
    url = {
        "unreachable": f"postgresql://keel:{PASSWORD}@127.0.0.1:{free_port()}/keel",
        "wrong password": postgres_cluster.url(password="not-" + PASSWORD),
        "no such database": postgres_cluster.url("missing_db"),
    }[problem]
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": [{"text": "done"}]}))
    for args in (("runs",), ("run", "hello", "--model", f"script:{script}", "--repo", ".")):
        done = keel(*args, "--store", url)
        assert done.returncode == 2, done.stderr
        assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
        assert PASSWORD not in done.stderr + done.stdout
        assert redact(url) in done.stderr


def test_credentials_in_the_url_never_enter_the_store_events_or_output(
    pg_url: str, tmp_path: Path
) -> None:
    script = tmp_path / "script.json"
    turns = [{"tool_calls": [{"name": "list_files", "arguments": {}}]}, {"text": "done"}]
    script.write_text(json.dumps({"turns": turns}))
    ran = keel("run", "List the files.", "--model", f"script:{script}", "--repo", str(tmp_path),
               "--json", env={"KEEL_STORE": pg_url})  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    run_id = json.loads(ran.stdout)["run_id"]
    shown = keel("show", run_id, "--json", "--store", pg_url)
    listed = keel("runs", "--store", pg_url)
    assert run_id in listed.stdout and json.loads(shown.stdout)["run"]["status"] == "completed"
    for done in (ran, shown, listed):
        assert PASSWORD not in done.stdout + done.stderr
    with psycopg.connect(pg_url) as conn:
        tables = ["runs", "events", "counters", "elisions", "blobs", "dispatch"]
        dump = "".join(
            str(conn.execute(f"SELECT * FROM keel.{t}").fetchall())  # type: ignore[arg-type]
            for t in tables
        )
    assert run_id in dump and PASSWORD not in dump


def test_only_the_journal_before_a_side_effect_waits_for_the_wal_flush(pg_url: str) -> None:
    store = PostgresStore(pg_url)
    state = RunState()
    asyncio.run(
        store.create_run("run_1", "q", "m", RunConfig("m", "p"), state, lease="o", lease_ttl=30)
    )
    store.close()
    plain = RunStarted(question="q", model="m", seq=0, at=1.0)
    journal = ToolDispatched(call_id="c", call_key="k", name="write_file", seq=0, at=1.0)
    seen = {}
    with psycopg.connect(pg_url) as conn:
        for name, event in (("plain", plain), ("journal", journal)):
            with conn.transaction(force_rollback=True):
                cp = Checkpoint("run_1", state, events=[event], lease="o", lease_ttl=30)
                _write_checkpoint(conn, cp)
                seen[name] = conn.execute("SHOW synchronous_commit").fetchone()[0]  # type: ignore[index]
    assert seen == {"plain": "off", "journal": "on"}
