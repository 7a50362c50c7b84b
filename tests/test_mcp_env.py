"""What a stdio MCP server's environment holds, with the official memory server
(`@modelcontextprotocol/server-memory`, from npm) and real `keel` processes: `--mcp-env
NAME=VALUE` and an `[[mcp]]` table's `env = {NAME = "value"}` point it at its file
(`MEMORY_FILE_PATH`; without it the server writes inside its own package folder), the values
are never stored (only the names), and `keel resume` reads a flag's value again from Keel's
environment, or refuses, naming the variable, when it is not there.

npm installs the server once per machine into the test cache (tests/side_installs.py), in a
folder named after the package file; if npm cannot install it, these tests skip with npm's own
error."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from side_installs import npm_package
from test_mcp_cli import Keel, outcome

SOURCE = Path(__file__).resolve().parent / "mcp_memory_server"
PACKAGE = "@modelcontextprotocol/server-memory"
MARKER = "secret-7f3a9"
"""In every value given: it must not appear anywhere in the store."""
ENTITY = {"name": "lease", "entityType": "concept", "observations": ["held by one process"]}
CREATE = {"tool_calls": [{"name": "create_entities", "arguments": {"entities": [ENTITY]}}]}
ANSWER = {"text": "Noted: a lease is held by one process."}


@pytest.fixture(scope="session")
def memory_server(pytestconfig: pytest.Config) -> str:
    """The command that starts the memory server over stdio (installed once, ~5 s)."""
    folder = npm_package(pytestconfig, "mcp-memory-server", SOURCE, PACKAGE)
    script = folder / "node_modules" / "@modelcontextprotocol" / "server-memory" / "dist"
    return shlex.join(["node", str(script / "index.js")])


def stored_bytes(keel: Keel) -> bytes:
    return b"".join(p.read_bytes() for p in keel.tmp.glob("runs.sqlite*"))


def memory_file(tmp_path: Path) -> Path:
    folder = tmp_path / MARKER
    folder.mkdir()
    return folder / "memory.jsonl"


def test_mcp_env_flag_sets_the_servers_variable_and_only_its_name_is_stored(
    tmp_path: Path, memory_server: str
) -> None:
    keel, memory = Keel(tmp_path), memory_file(tmp_path)
    proc = keel(
        "run", "Remember what a lease is.", "--model", keel.script([CREATE, ANSWER]),
        "--mcp", memory_server, "--mcp-env", f"MEMORY_FILE_PATH={memory}",
        "--approve-tools", "create_entities", "--json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert outcome(proc)["status"] == "completed"
    assert json.loads(memory.read_text().splitlines()[0])["name"] == "lease"
    assert MARKER.encode() not in stored_bytes(keel)
    assert b"MEMORY_FILE_PATH" in stored_bytes(keel)


def test_resume_reads_an_mcp_env_flags_value_from_keels_environment_or_names_it(
    tmp_path: Path, memory_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    keel, memory = Keel(tmp_path), memory_file(tmp_path)
    proc = keel(
        "run", "Remember what a lease is.", "--model", keel.script([CREATE, ANSWER]),
        "--mcp", memory_server, "--mcp-env", f"MEMORY_FILE_PATH={memory}", "--json",
    )  # fmt: skip
    assert outcome(proc)["status"] == "awaiting_approval", proc.stderr
    run_id = outcome(proc)["run_id"]
    assert keel("approve", run_id, "--all").returncode == 0
    refused = keel("resume", run_id)
    assert refused.returncode == 2, refused.stderr
    assert "MEMORY_FILE_PATH=VALUE" in refused.stderr and "Traceback" not in refused.stderr
    monkeypatch.setenv("MEMORY_FILE_PATH", str(memory))  # Keel's environment, for the resume
    resumed = keel("resume", run_id, "--json")
    assert outcome(resumed)["status"] == "completed", resumed.stderr
    assert json.loads(memory.read_text().splitlines()[0])["name"] == "lease"
    assert MARKER.encode() not in stored_bytes(keel)


def test_an_mcp_tables_env_sets_the_servers_variable_and_is_never_stored(
    tmp_path: Path, memory_server: str
) -> None:
    keel, memory = Keel(tmp_path), memory_file(tmp_path)
    (keel.config / "keel" / "keel.toml").write_text(
        f'[[mcp]]\nname = "memory"\ncommand = {json.dumps(shlex.split(memory_server))}\n'
        f'approve = ["create_entities"]\nenv = {{MEMORY_FILE_PATH = {json.dumps(str(memory))}}}\n'
    )
    proc = keel("run", "Remember it.", "--model", keel.script([CREATE, ANSWER]), "--json")
    assert outcome(proc)["status"] == "completed", proc.stderr
    assert json.loads(memory.read_text().splitlines()[0])["name"] == "lease"
    assert MARKER.encode() not in stored_bytes(keel)
