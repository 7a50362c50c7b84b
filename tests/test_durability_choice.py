"""Choosing durability (`keel/durability.py`, ADR 0020): `process` by default, `power` from the
library, `--durability` or `keel.toml`; anything else is a configuration error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import keel
from keel.cli.app import app
from keel.config import trust
from keel.errors import ConfigError
from keel.run_options import resolve_one

runner = CliRunner()


def test_durability_comes_from_the_flag_then_keel_toml_then_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))  # no user keel.toml
    assert resolve_one("durability", cwd=tmp_path) == "process"
    (tmp_path / "keel.toml").write_text('model = "local"\n')
    assert resolve_one("durability", cwd=tmp_path) == "process"
    (tmp_path / "keel.toml").write_text('durability = "power"\n')
    # a working-directory file: not trusted
    assert resolve_one("durability", cwd=tmp_path) == "process"
    trust(tmp_path)
    assert resolve_one("durability", cwd=tmp_path) == "power"
    assert resolve_one("durability", "process", cwd=tmp_path) == "process"


@pytest.mark.parametrize("bad", ["fast", "POWER", 1])
def test_an_unknown_durability_is_a_configuration_error(
    tmp_path: Path, bad: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    (tmp_path / "keel.toml").write_text(f"durability = {json.dumps(bad)}\n")
    trust(tmp_path)
    with pytest.raises(ConfigError, match=r"keel\.toml: durability must be"):
        resolve_one("durability", cwd=tmp_path)
    with pytest.raises(ConfigError, match="durability must be"):
        keel.Store(tmp_path / "s.sqlite", durability=bad)  # type: ignore[arg-type]


def test_an_agent_opens_its_store_at_its_durability_and_refuses_a_store_opened_otherwise(
    tmp_path: Path,
) -> None:
    transport = keel.ScriptedTransport.from_dict({"turns": [{"text": "done"}]})
    with keel.Agent(transport, store=tmp_path / "a.sqlite", durability="power") as agent:
        assert agent.store.durability == "power"
        assert agent.run("q").status == "completed"
    store = keel.Store(tmp_path / "b.sqlite")
    try:
        assert keel.Agent(transport, store=store).durability == "process"
        with pytest.raises(ConfigError, match=r"Store\(\.\.\., durability='power'\)"):
            keel.Agent(transport, store=store, durability="power")
    finally:
        store.close()


def test_keel_run_and_resume_take_durability_and_refuse_an_unknown_one(tmp_path: Path) -> None:
    model = tmp_path / "script.json"
    model.write_text(json.dumps({"turns": [{"text": "done"}]}))
    store = str(tmp_path / "s.sqlite")
    common = ["--model", f"script:{model}", "--store", store, "--json"]
    done = runner.invoke(app, ["run", "q", *common, "--durability", "power"])
    assert done.exit_code == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "completed"
    bad = runner.invoke(app, ["run", "q", *common, "--durability", "fast"])
    assert bad.exit_code == 2
    assert "--durability must be" in bad.stderr and "Traceback" not in bad.stderr
    run_id = json.loads(done.stdout)["run_id"]
    again = runner.invoke(app, ["resume", run_id, "--store", store, "--durability", "sometimes"])
    assert again.exit_code == 2 and "--durability must be" in again.stderr
