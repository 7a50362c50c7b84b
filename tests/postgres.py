"""A real, throwaway PostgreSQL cluster for the tests (``pytest_plugins = ["postgres"]``).

`postgres_cluster` (once per session): `initdb` in a fresh temporary folder, `pg_ctl start` on a
free loopback port, password logins (scram-sha-256) for TCP; stopped and removed at the end.
`pg_url`: a new, empty database in it for one test, as a `postgresql://` URL with a password.
`store_target`: a test once on a SQLite file and once on a `pg_url` database; `sql` changes
either behind the store's back.

Debian's `postgresql` package provides the binaries (`.ci/run` installs it); they live under
/usr/lib/postgresql/<version>/bin. initdb and the server refuse to run as root, so when the
tests run as root (CI here) the cluster belongs to the `postgres` user the package created and
its commands run through `runuser -u postgres`; otherwise they run as the current user. No
mock: a missing installation fails the tests that need it, saying how to install it.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import sqlite3
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

USER, PASSWORD = "keel", "s3cret-pw"


def postgres_bin() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        pytest.fail("PostgreSQL is not installed: apt-get install -y postgresql (see .ci/run)")
    return Path(found[-1]).parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Cluster:
    bin: Path
    data: Path
    port: int
    as_postgres: bool

    def url(self, database: str = "postgres", password: str = PASSWORD) -> str:
        return f"postgresql://{USER}:{password}@127.0.0.1:{self.port}/{database}"

    def command(self, *args: str) -> list[str]:
        return ["runuser", "-u", "postgres", "--", *args] if self.as_postgres else list(args)

    def run(self, *args: str) -> None:
        subprocess.run(self.command(*args), check=True, capture_output=True, text=True)

    def create_database(self) -> str:
        name = "t_" + uuid.uuid4().hex[:12]
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')  # type: ignore[arg-type]
        return name

    def drop_database(self, name: str) -> None:
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')  # type: ignore[arg-type]


def start_cluster(fsync: bool = False) -> Cluster:
    """initdb + pg_ctl start; `fsync` off for tests (only clients crash in them), on for the
    benchmarks."""
    bindir = postgres_bin()
    as_postgres = os.geteuid() == 0
    root = Path(tempfile.mkdtemp(prefix="keel-pg-"))
    if as_postgres:
        shutil.chown(root, "postgres")
    cluster = Cluster(bindir, root / "data", free_port(), as_postgres)
    pwfile = root / "pw"
    pwfile.write_text(PASSWORD + "\n")
    if as_postgres:
        shutil.chown(pwfile, "postgres")
    cluster.run(
        str(bindir / "initdb"),
        "-D", str(cluster.data), "-U", USER, "--pwfile", str(pwfile),
        "--auth-host=scram-sha-256", "--auth-local=trust", "-E", "UTF8", "--no-sync",
    )  # fmt: skip
    options = (
        f"-p {cluster.port} -k {root} -c listen_addresses=127.0.0.1 -c max_connections=300"
        f" -c fsync={'on' if fsync else 'off'}"
        " -c full_page_writes=off -c shared_buffers=64MB"
    )
    cluster.run(
        str(bindir / "pg_ctl"), "-D", str(cluster.data), "-o", options,
        "-l", str(root / "log"), "-w", "-t", "60", "start",
    )  # fmt: skip
    return cluster


def stop_cluster(cluster: Cluster) -> None:
    try:
        cluster.run(str(cluster.bin / "pg_ctl"), "-D", str(cluster.data), "-m", "immediate", "stop")
    finally:
        shutil.rmtree(cluster.data.parent, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[Cluster]:
    cluster = start_cluster()
    try:
        yield cluster
    finally:
        stop_cluster(cluster)


@pytest.fixture
def pg_url(postgres_cluster: Cluster) -> Iterator[str]:
    name = postgres_cluster.create_database()
    try:
        yield postgres_cluster.url(name)
    finally:
        postgres_cluster.drop_database(name)


@pytest.fixture(params=["sqlite", "postgres"])
def store_target(request: pytest.FixtureRequest, tmp_path: Path) -> str | Path:
    """Where a store lives, for a test that must hold on both: a file, or a new database in the
    test cluster."""
    if request.param == "sqlite":
        return tmp_path / "runs.sqlite"
    url: str = request.getfixturevalue("pg_url")
    return url


def sql(target: str | Path, statement: str) -> list[tuple[object, ...]]:
    """Run `statement` on the store's database as another program would (its `runs` table is
    `keel.runs` in Postgres); the rows it returns."""
    if isinstance(target, Path):
        with sqlite3.connect(target) as conn:
            return conn.execute(statement).fetchall()
    with psycopg.connect(target, autocommit=True) as pg:
        cursor = pg.execute(statement.replace("runs", "keel.runs", 1))  # type: ignore[arg-type]
        return cursor.fetchall() if cursor.description else []
