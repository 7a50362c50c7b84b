"""Issue 9: reading a store never writes to it. `keel runs` and `keel show` open the file
read-only (so they work on a read-only file or folder and never upgrade a schema); a store
written by a newer Keel is refused by name, for reading and writing; a column Keel does not
know breaks nothing."""

from __future__ import annotations

import hashlib
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from keel.cli.app import app
from keel.errors import ConfigError, StoreError
from keel.records import RunConfig, RunStarted, RunState
from keel.store import Checkpoint, Store
from keel.store.schema import VERSION

OWNER = "host:1:me"


def cli(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, result.stdout, result.stderr


async def a_store(path: Path, runs: int = 1) -> None:
    store = Store(path)
    for n in range(runs):
        run_id = f"run_{n}"
        await store.create_run(
            run_id,
            f"question {n}",
            "m",
            RunConfig("m", "sys"),
            RunState(),
            lease=OWNER,
            lease_ttl=60,
        )
        event = RunStarted(step=0, seq=0, at=1.0, question="q", model="m")
        state = RunState(step=1, next_seq=1)
        await store.save_step(Checkpoint(run_id, state, events=[event], lease=OWNER))
    store.close()


def fingerprint(path: Path) -> tuple[str, int, int]:
    """The file's bytes, its mtime and its schema version."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
    return digest, path.stat().st_mtime_ns, version


async def test_a_store_from_a_newer_keel_is_refused_by_name_and_left_untouched(
    tmp_path: Path,
) -> None:
    path = tmp_path / "runs.sqlite"
    await a_store(path)
    with sqlite3.connect(path) as conn:
        conn.execute("ALTER TABLE runs ADD COLUMN priority INTEGER")
        conn.execute("PRAGMA user_version=99")
    before = fingerprint(path)
    newer = rf"written by a newer Keel \(schema 99; this one knows {VERSION}\): upgrade Keel"
    with pytest.raises(StoreError, match=newer):
        Store(path)
    with pytest.raises(StoreError, match=newer):
        Store(path, read_only=True)
    for command in (["runs"], ["show", "run_0"], ["approve", "run_0", "--all"]):
        code, _, err = cli(*command, "--store", str(path))
        assert code == 2 and f"newer Keel (schema 99; this one knows {VERSION})" in err, err
    assert fingerprint(path) == before


async def test_runs_and_show_never_write_not_even_a_schema_upgrade(tmp_path: Path) -> None:
    path = tmp_path / "runs.sqlite"
    await a_store(path, runs=2)
    with sqlite3.connect(path) as conn:  # as if written by the first schema's Keel
        conn.execute("ALTER TABLE runs DROP COLUMN lease_owner")
        conn.execute("ALTER TABLE runs DROP COLUMN lease_until")
        conn.execute("PRAGMA user_version=1")
    before = fingerprint(path)
    code, out, _ = cli("runs", "--store", str(path))
    assert code == 0 and "run_0" in out and "run_1" in out
    code, out, _ = cli("show", "run_1", "--json", "--store", str(path))
    assert code == 0 and '"run_started"' in out
    assert fingerprint(path) == before


async def test_a_column_this_keel_does_not_know_breaks_neither_writes_nor_reads(
    tmp_path: Path,
) -> None:
    path = tmp_path / "runs.sqlite"
    await a_store(path)
    with sqlite3.connect(path) as conn:
        conn.execute("ALTER TABLE runs ADD COLUMN priority INTEGER DEFAULT 3")
        conn.execute("ALTER TABLE counters ADD COLUMN note TEXT")
    store = Store(path)
    await store.create_run("run_new", "q", "m", RunConfig("m", "sys"), RunState(), lease=OWNER)
    event = RunStarted(step=0, seq=0, at=1.0, question="q", model="m")
    await store.save_step(Checkpoint("run_new", RunState(step=1), events=[event], lease=OWNER))
    record = store.get_run("run_new")
    assert record is not None and record.state.step == 1
    assert {r.run_id for r in store.list_runs()} == {"run_0", "run_new"}
    store.close()


async def test_a_read_only_store_refuses_writes(tmp_path: Path) -> None:
    path = tmp_path / "runs.sqlite"
    await a_store(path)
    store = Store(path, read_only=True)
    with pytest.raises(ConfigError, match="read-only"):
        store.decide("run_0", "call_1", approved=True, by="ana")
    assert store.get_run("run_0") is not None
    store.close()


@pytest.fixture
def frozen(tmp_path: Path) -> Iterator[Path]:
    """A folder nothing can be created in, even by root (`chattr +i`); tests run as root, where
    chmod would not stop a write. Skipped where chattr is not available."""
    folder = tmp_path / "frozen"
    folder.mkdir()
    yield folder
    subprocess.run(["chattr", "-i", str(folder)], capture_output=True)


def freeze(folder: Path) -> None:
    done = subprocess.run(["chattr", "+i", str(folder)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot make a folder immutable here: {done.stderr.decode().strip()}")


async def test_runs_and_show_read_a_store_in_a_read_only_folder(frozen: Path) -> None:
    path = frozen / "runs.sqlite"
    await a_store(path)  # closed cleanly: no -wal or -shm beside it
    freeze(frozen)
    code, out, err = cli("runs", "--store", str(path))
    assert code == 0 and "run_0" in out, err
    code, out, err = cli("show", "run_0", "--store", str(path))
    assert code == 0 and "question 0" in out, err


async def test_a_read_only_folder_still_shows_commits_still_in_the_write_ahead_log(
    frozen: Path,
) -> None:
    """A writer is open (its -wal holds commits not yet in the database file): the reader must
    see them, not the stale database file alone."""
    path = frozen / "runs.sqlite"
    await a_store(path)
    writer = sqlite3.connect(path)
    writer.execute("PRAGMA wal_autocheckpoint=0")
    with writer:
        writer.execute("UPDATE runs SET question = 'changed in the log'")
    freeze(frozen)
    try:
        code, out, err = cli("runs", "--store", str(path))
    finally:
        writer.close()
    assert code == 0 and "changed in the log" in out, err


async def test_a_read_only_folder_with_a_log_it_cannot_read_is_refused_not_read_stale(
    frozen: Path, tmp_path: Path
) -> None:
    """A -wal with commits but no -shm, in a folder where -shm cannot be created: reading the
    database file alone (immutable) would silently miss those commits."""
    path = frozen / "runs.sqlite"
    await a_store(path)
    writer = sqlite3.connect(path)
    writer.execute("PRAGMA wal_autocheckpoint=0")
    with writer:
        writer.execute("UPDATE runs SET question = 'only in the log'")
    saved = {side: Path(f"{path}{side}").read_bytes() for side in ("", "-wal")}
    writer.close()
    for leftover in frozen.iterdir():
        leftover.unlink()
    for side, data in saved.items():
        Path(f"{path}{side}").write_bytes(data)
    freeze(frozen)
    with pytest.raises(StoreError, match=r"has commits in .*-wal that cannot be read"):
        Store(path, read_only=True)
