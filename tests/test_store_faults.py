"""Issue 9: the store under faults. A stale lease holder, a corrupt file, a full disk, a file
deleted under the run: each ends in one classified error (LeaseLost or StoreError naming the
file), never a traceback, and the worker thread keeps serving."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from keel.cli.app import app
from keel.errors import LeaseLost, StoreError
from keel.records import RunConfig, RunStarted, RunState
from keel.store import Checkpoint, Store
from tmpfs import small_tmpfs

OWNER = "host:1:me"


async def started(store: Store, run_id: str = "run_1", owner: str = OWNER) -> None:
    await store.create_run(
        run_id, "q", "m", RunConfig("m", "sys"), RunState(), lease=owner, lease_ttl=60
    )


def step(seq: int, *, owner: str = OWNER, blob: str = "", run_id: str = "run_1") -> Checkpoint:
    state = RunState(step=seq + 1, next_seq=seq + 1)
    event = RunStarted(step=seq, seq=seq, at=1.0, question="q", model="m")
    blobs = [(f"digest-{seq}", blob)] if blob else []
    return Checkpoint(run_id, state, events=[event], blobs=blobs, lease=owner, lease_ttl=60)


def alive(store: Store) -> bool:
    probe = store._worker.submit(lambda c: c.execute("SELECT 1").fetchone(), write=False)
    return bool(probe.result(timeout=5) == (1,))


# -- a stale lease holder ---------------------------------------------------------------------


async def test_stale_lease_holder_gets_lease_lost_not_integrity_error(tmp_path: Path) -> None:
    store = Store(tmp_path / "runs.sqlite")
    await started(store)
    await store.save_step(step(0))
    # Another process took the run over and already logged the next event (seq 1).
    take_over = "UPDATE runs SET lease_owner = 'elsewhere:2:new' WHERE run_id = 'run_1'"
    store._worker.submit(lambda c: c.execute(take_over), write=True).result(timeout=5)
    await store.save_step(step(1, owner="elsewhere:2:new"))
    with pytest.raises(LeaseLost):
        await store.save_step(step(1))  # the stale holder, colliding on seq 1
    # Grouped with a good write: the stale one fails alone, the other lands.
    await started(store, "run_2")
    stale, good = store.save_step(step(2)), store.save_step(step(0, run_id="run_2"))
    outcomes = await asyncio.gather(stale, good, return_exceptions=True)
    assert isinstance(outcomes[0], LeaseLost) and outcomes[1] is None
    assert [e.seq for e in store.events("run_2")] == [0]
    assert alive(store)
    store.close()


SLOW_SCRIPT = {
    "turns": [
        {"tool_calls": [{"name": "read_file", "arguments": {"path": "notes.md"}}]},
        {"text": "Done."},
    ],
    "latency_ms": 1500,
}


def stopped(pid: int) -> None:
    """Return once the process is stopped: SIGSTOP is sent at once, obeyed a moment later."""
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
        if time.monotonic() > deadline:
            pytest.fail(f"process {pid} did not stop within 10 s of SIGSTOP")
        time.sleep(0.005)


def test_keel_run_paused_past_its_lease_and_taken_over_exits_2_with_one_line(
    tmp_path: Path,
) -> None:
    """SIGSTOP `keel run` during a slow model turn, take its run over from here (another
    owner, an event at the next seq), SIGCONT: its next checkpoint must stop it with LeaseLost."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "notes.md").write_text("notes\n")
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SLOW_SCRIPT))
    db = tmp_path / "runs.sqlite"
    command = [sys.executable, "-m", "keel", "run", "q", "--model", f"script:{script}"]
    command += ["--repo", str(repo), "--store", str(db), "--json"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # until the question is checkpointed
            if db.exists() and _count(db, "SELECT count(*) FROM events") > 0:
                break
            time.sleep(0.01)
        else:
            pytest.fail("the run never checkpointed its question")
        proc.send_signal(signal.SIGSTOP)
        stopped(proc.pid)  # a step it was committing as the signal came is in the file now
        with sqlite3.connect(db, timeout=10) as other:
            run_id, seq = other.execute(
                "SELECT run_id, max(seq) + 1 FROM events GROUP BY run_id"
            ).fetchone()
            other.execute(
                "UPDATE runs SET lease_owner = 'elsewhere:2:new', lease_until = ?",
                (time.time() + 600,),
            )
            other.execute(
                "INSERT INTO events VALUES (?, ?, 'run_resumed', 1.0, ?, NULL)",
                (run_id, seq, json.dumps({"step": 0, "model": "m"})),
            )
        proc.send_signal(signal.SIGCONT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("keel: "), err
    assert "taken over" in lines[0]
    assert json.loads(out)["error"]["message"] in lines[0]  # --json: the same error on stdout


def _count(db: Path, sql: str) -> int:
    try:
        with sqlite3.connect(db, timeout=1) as conn:
            return int(conn.execute(sql).fetchone()[0])
    except sqlite3.Error:
        return 0


# -- a corrupt store --------------------------------------------------------------------------


def cli(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, result.stdout, result.stderr


def test_a_file_of_garbage_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "runs.sqlite"
    path.write_bytes(os.urandom(8192))
    with pytest.raises(StoreError, match=f"{path}.*not a Keel store or is damaged"):
        Store(path)
    for command in (["runs"], ["show", "run_1"]):
        code, _, err = cli(*command, "--store", str(path))
        assert code == 2 and err.startswith("keel: ") and str(path) in err, err


async def test_a_store_with_overwritten_pages_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "runs.sqlite"
    store = Store(path)
    await started(store)
    for seq in range(6):
        await store.save_step(step(seq, blob=f"{seq}" * 9000))
    store.close()
    with path.open("r+b") as f:  # keep page 1 (the header and schema), wreck the rest
        f.seek(4096)
        f.write(b"\xa5" * (path.stat().st_size - 4096))
    for command in (["runs"], ["show", "run_1"], ["show", "run_1", "--json"]):
        code, out, err = cli(*command, "--store", str(path))
        assert code == 2 and err.startswith("keel: ") and str(path) in err, (command, err)
        assert "damaged" in err
        shown = json.loads(out)["error"]["message"] if "--json" in command else out
        assert shown == "" if "--json" not in command else "damaged" in shown


# -- a full disk ------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs; skipped where mounting is not allowed."""
    with small_tmpfs(tmp_path, "1m") as mount:
        yield mount


async def test_a_full_disk_fails_the_save_with_store_error_and_keeps_the_last_step(
    small_disk: Path,
) -> None:
    """A real full file system (a 1 MiB tmpfs)."""
    store = Store(small_disk / "runs.sqlite")
    await started(store)
    await store.save_step(step(0))
    with pytest.raises(StoreError) as raised:
        for seq in range(1, 40):
            await store.save_step(step(seq, blob=os.urandom(60_000).hex()))
    assert f"the store {small_disk / 'runs.sqlite'} is full" in str(raised.value)
    assert "keel resume run_1" in str(raised.value)
    saved = store.get_run("run_1")
    assert saved is not None and alive(store)
    assert [e.seq for e in store.events("run_1")] == list(range(saved.state.step))
    store.close()


async def test_a_full_database_fails_the_save_with_store_error_and_rolls_back(
    tmp_path: Path,
) -> None:
    """SQLITE_FULL simulated with `PRAGMA max_page_count` (works where mounting does not)."""
    path = tmp_path / "runs.sqlite"
    store = Store(path)
    await started(store)
    await store.save_step(step(0))
    count = "PRAGMA page_count"
    limit = store._worker.submit(lambda c: c.execute(count).fetchone()[0], write=False).result() + 2
    store._worker.submit(lambda c: c.execute(f"PRAGMA max_page_count={limit}"), write=False).result(
        timeout=5
    )
    with pytest.raises(StoreError, match=r"is full: step 2 could not be saved.*keel resume run_1"):
        await store.save_step(step(1, blob="x" * 100_000))
    assert alive(store)
    assert [e.seq for e in store.events("run_1")] == [0]  # rolled back whole
    await store.save_step(step(1))  # a small step still fits
    assert [e.seq for e in store.events("run_1")] == [0, 1]
    store.close()


# -- a file deleted or replaced under the run -------------------------------------------------


async def test_a_store_file_deleted_under_the_run_fails_the_next_save(tmp_path: Path) -> None:
    path = tmp_path / "runs.sqlite"
    store = Store(path)
    await started(store)
    await store.save_step(step(0))
    for side in ("", "-wal", "-shm"):
        Path(f"{path}{side}").unlink(missing_ok=True)
    with pytest.raises(StoreError, match="deleted or replaced"):
        await store.save_step(step(1))
    assert alive(store)
    store.close()


async def test_a_store_file_replaced_under_the_run_fails_the_next_save(tmp_path: Path) -> None:
    path = tmp_path / "runs.sqlite"
    store = Store(path)
    await started(store)
    shutil.copy(path, tmp_path / "copy.sqlite")
    os.replace(tmp_path / "copy.sqlite", path)
    with pytest.raises(StoreError, match="deleted or replaced"):
        await store.save_step(step(0))
    store.close()
