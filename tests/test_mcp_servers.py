"""Which MCP servers a run uses, and what of them is saved with it (never a secret)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import keel
from keel.tools.mcp_servers import McpServer, servers_from_config, servers_from_settings


def test_a_server_spec_round_trips_through_the_runs_settings() -> None:
    servers = [
        McpServer.stdio("python server.py --log 'a b.jsonl'", approve=["add_note"], env=["TOKEN"]),
        McpServer.http("http://127.0.0.1:8000/mcp", name="remote", prefix="r_", timeout=5),
    ]
    saved = json.loads(json.dumps({"mcp": [s.to_json() for s in servers]}))
    assert servers_from_settings(saved) == servers
    assert servers[0].command == ("python", "server.py", "--log", "a b.jsonl")
    assert servers[0].name == "python server.py --log 'a b.jsonl'"
    assert servers_from_settings({}) == []


def test_an_mcp_servers_environment_is_saved_by_name_never_by_value(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MCP_TOKEN", "s3cr3t-value")
    saved = json.dumps(McpServer.stdio("server", env=["MCP_TOKEN"]).to_json())
    assert "MCP_TOKEN" in saved and "s3cr3t-value" not in saved


def test_an_mcp_url_with_credentials_is_refused() -> None:
    with pytest.raises(keel.ConfigError, match="must not carry a user name or password"):
        McpServer.http("https://user:pass@example.org/mcp")
    with pytest.raises(keel.ConfigError, match="http:// or https://"):
        McpServer.http("ftp://example.org/mcp")


def test_mcp_tables_are_checked_with_clear_errors(tmp_path: Path) -> None:
    config = tmp_path / "keel.toml"
    config.write_text('[[mcp]]\ncommand = "server"\nurl = "http://127.0.0.1/mcp"\n')
    with pytest.raises(keel.ConfigError, match="either command or url"):
        servers_from_config(config)
    config.write_text('[[mcp]]\ncommand = "server"\napprove = "add_note"\n')
    with pytest.raises(keel.ConfigError, match="approve must be a list of strings"):
        servers_from_config(config)
    config.write_text('[[mcp]]\ncommand = "server"\nenvironment = ["X"]\n')
    with pytest.raises(keel.ConfigError, match="unknown key"):
        servers_from_config(config)
    config.write_text('[[mcp]]\nname = "a"\ncommand = ["server", "--flag"]\ntimeout = 5\n')
    assert servers_from_config(config) == [
        McpServer.stdio(["server", "--flag"], name="a", timeout=5)
    ]
    assert servers_from_config(tmp_path / "missing.toml") == []


def test_mcp_tools_takes_strings_as_servers() -> None:
    assert McpServer.parse("http://127.0.0.1:1/mcp").url == "http://127.0.0.1:1/mcp"
    assert McpServer.parse("uvx some-server --x").command == ("uvx", "some-server", "--x")


def test_import_keel_does_not_load_the_mcp_package() -> None:
    code = "import sys, keel; print(any(m == 'mcp' or m.startswith('mcp.') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_an_mcp_table_sets_env_values_and_passes_env_names(tmp_path: Path) -> None:
    config = tmp_path / "keel.toml"
    config.write_text(
        '[[mcp]]\nname = "memory"\ncommand = "server"\n'
        'env = {MEMORY_FILE_PATH = "/data/memory.jsonl"}\nenv_pass = ["GLOSSARY_TOKEN"]\n'
    )
    (server,) = servers_from_config(config)
    assert server.env == ("GLOSSARY_TOKEN",)
    assert server.env_values == (("MEMORY_FILE_PATH", "/data/memory.jsonl"),)
    config.write_text('[[mcp]]\ncommand = "server"\nenv = {X = 1}\n')
    with pytest.raises(keel.ConfigError, match="env values must be strings"):
        servers_from_config(config)
    config.write_text('[[mcp]]\ncommand = "server"\nenv = {"NOT A NAME" = "v"}\n')
    with pytest.raises(keel.ConfigError, match="not an environment variable name"):
        servers_from_config(config)


def test_an_mcp_servers_env_values_are_never_saved_and_are_read_again_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = McpServer.stdio("server", name="memory", env={"MEMORY_TOKEN": "s3cr3t-value"})
    saved = json.loads(json.dumps({"mcp": [server.to_json()]}))
    assert "MEMORY_TOKEN" in json.dumps(saved) and "s3cr3t-value" not in json.dumps(saved)
    config = tmp_path / "keel.toml"  # a resume reads the value where it came from, again
    config.write_text('[[mcp]]\nname = "memory"\ncommand = "server"\nenv = {MEMORY_TOKEN = "v2"}\n')
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "none"))
    monkeypatch.setenv("MEMORY_TOKEN", "from-keels-environment")
    assert servers_from_settings(saved)[0].start_env() == {"MEMORY_TOKEN": "from-keels-environment"}
    assert servers_from_settings(saved, config=config)[0].start_env() == {"MEMORY_TOKEN": "v2"}
    monkeypatch.delenv("MEMORY_TOKEN")
    with pytest.raises(keel.ConfigError, match=r"MEMORY_TOKEN.*not saved.*MEMORY_TOKEN=VALUE"):
        servers_from_settings(saved)[0].start_env()


def test_mcp_env_flags_set_variables_of_the_mcp_servers() -> None:
    from keel.tools.mcp_servers import servers_from_flags

    (server,) = servers_from_flags(["server"], [], env=["MEMORY_FILE_PATH=/tmp/m=1.jsonl"])
    assert server.start_env() == {"MEMORY_FILE_PATH": "/tmp/m=1.jsonl"}
    for bad in ("NOVALUE", "=v", "A B=v"):
        with pytest.raises(keel.ConfigError, match="--mcp-env"):
            servers_from_flags(["server"], [], env=[bad])
    with pytest.raises(keel.ConfigError, match="--mcp-env is for --mcp servers"):
        servers_from_flags([], ["http://127.0.0.1:8000/mcp"], env=["A=b"])
