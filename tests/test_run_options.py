"""The options model (keel/run_options.py, ADR 0045): each option declared once, the command
line, keel.toml and the run's limits made from it, and one order of resolution whose sources
the run keeps."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

import keel
from keel.cli import flags
from keel.cli.app import APP_SETTINGS, app
from keel.config import trust
from keel.errors import ConfigError
from keel.limits import Limits
from keel.run_options import BY_NAME, OPTIONS, Option, resolve, unknown_keys
from keel.store import Store

runner = CliRunner()


@pytest.fixture(autouse=True)
def no_user_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    for name in ("KEEL_MODEL", "KEEL_BASE_URL", "KEEL_STORE", "KEEL_MAX_MODEL_CALLS"):
        monkeypatch.delenv(name, raising=False)


def _help(*command: str) -> str:
    result = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "200"}, terminal_width=200)
    assert result.exit_code == 0, result.output
    return " ".join(result.stdout.split())


def test_every_limit_is_an_option_of_every_command_that_starts_a_run() -> None:
    hidden = {"repeat_synthesis"}  # a measuring switch (keel replay), not a user's option
    limits = {f.name for f in dataclasses.fields(Limits)} - hidden
    assert limits <= set(BY_NAME)
    for command in ("run", "ask", "serve", "submit"):
        text = _help(command)
        for name in limits:
            assert BY_NAME[name].flag_name.split("/")[0] in text, (command, name)
    assert "--max-model-calls" in _help("run") and "[default: 50]" in _help("run")


def test_a_new_option_reaches_the_command_line_keel_toml_and_resolution_without_other_edits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Declaring one `Option` is the whole edit: the command's flag, the keel.toml key (read,
    and not warned about as unknown) and the environment variable follow from it."""
    added = Option("reading_speed", "int", "Pages a reader takes per turn.", default=3)
    options = (*OPTIONS, added)
    import keel.run_options as run_options

    monkeypatch.setattr(run_options, "OPTIONS", options)
    monkeypatch.setattr(run_options, "BY_NAME", {o.name: o for o in options})
    monkeypatch.setattr(run_options, "TOML_KEYS", (*run_options.TOML_KEYS, "reading_speed"))
    monkeypatch.setattr(flags, "OPTIONS", options)

    seen: dict[str, object] = {}

    @flags.with_agent_options()
    def command(**given: object) -> None:
        seen.update(resolve(given, cwd=tmp_path).values)

    alone = typer.Typer(**APP_SETTINGS)
    alone.command()(command)
    shown = runner.invoke(alone, ["--help"], env={"COLUMNS": "200"}, terminal_width=200)
    assert "--reading-speed" in shown.stdout and "[default: 3]" in shown.stdout
    ran = runner.invoke(alone, ["--reading-speed", "9"])
    assert ran.exit_code == 0, ran.output
    assert seen["reading_speed"] == 9
    (tmp_path / "keel.toml").write_text("reading_speed = 5\n")
    trust(tmp_path)
    assert resolve({}, cwd=tmp_path).values["reading_speed"] == 5
    assert unknown_keys(tmp_path) == []
    environment = {"KEEL_READING_SPEED": "7"}
    assert resolve({}, cwd=tmp_path, env=environment).values["reading_speed"] == 7


def test_resolve_takes_the_flag_then_the_environment_then_keel_toml_then_the_default(
    tmp_path: Path,
) -> None:
    (tmp_path / "keel.toml").write_text("max_model_calls = 12\nloop_threshold = 4\n")
    trust(tmp_path)
    env = {"KEEL_MAX_MODEL_CALLS": "9"}
    chosen = resolve({"max_model_calls": 3}, cwd=tmp_path, env=env)
    assert chosen.values["max_model_calls"] == 3
    assert chosen.sources["max_model_calls"] == "--max-model-calls"
    chosen = resolve({}, cwd=tmp_path, env=env)
    assert (chosen.values["max_model_calls"], chosen.sources["max_model_calls"]) == (
        9,
        "KEEL_MAX_MODEL_CALLS",
    )
    assert chosen.values["loop_threshold"] == 4
    assert chosen.sources["loop_threshold"] == str(tmp_path / "keel.toml")
    chosen = resolve({}, cwd=tmp_path, env={})
    assert chosen.values["max_model_calls"] == 12
    assert chosen.values["max_tool_calls"] == Limits().max_tool_calls
    assert chosen.sources["max_tool_calls"] == "default"
    assert chosen.limits() == Limits(max_model_calls=12, loop_threshold=4)


def test_an_untrusted_keel_toml_in_the_working_directory_sets_no_option(tmp_path: Path) -> None:
    (tmp_path / "keel.toml").write_text("max_model_calls = 2\n")
    chosen = resolve({}, cwd=tmp_path, env={})
    assert chosen.values["max_model_calls"] == Limits().max_model_calls
    assert any("not trusted" in w for w in chosen.warnings)


@pytest.mark.parametrize(
    ("env", "toml", "message"),
    [
        ({"KEEL_MAX_MODEL_CALLS": "many"}, "", r"KEEL_MAX_MODEL_CALLS='many': max_model_calls"),
        ({"KEEL_DEADLINE": "inf"}, "", r"KEEL_DEADLINE: deadline must be a finite number"),
        ({"KEEL_BROWSER": "perhaps"}, "", r"KEEL_BROWSER='perhaps': browser must be true"),
        ({}, 'max_tool_calls = "ten"\n', r"keel\.toml: max_tool_calls must be a int"),
        ({}, "allow_hosts = [1]\n", r"keel\.toml: allow_hosts must be a list of strings"),
        ({}, 'loop_policy = "fast"\n', r"keel\.toml: loop_policy: loop policy must be one of"),
    ],
)
def test_a_value_that_cannot_be_used_names_where_it_came_from(
    tmp_path: Path, env: dict[str, str], toml: str, message: str
) -> None:
    if toml:
        (tmp_path / "keel.toml").write_text(toml)
        trust(tmp_path, grant=["allow_hosts"] if "allow_hosts" in toml else ())  # ADR 0062
    with pytest.raises(ConfigError, match=message):
        resolve({}, cwd=tmp_path, env=env)


def test_the_library_and_the_command_line_agree_on_the_local_models_first_turn() -> None:
    assert keel.Agent("local").limits.first_turn_tool is True
    assert keel.Agent("local", limits=Limits(max_model_calls=3)).limits.first_turn_tool is True
    assert keel.Agent("local", limits=Limits(first_turn_tool=False)).limits.first_turn_tool is False
    script = keel.ScriptedTransport.from_dict({"turns": [{"text": "done"}]})
    assert keel.Agent(script).limits.first_turn_tool is False


def test_keel_show_says_where_each_option_that_was_not_a_default_came_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "notes.md").write_text("notes\n")
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": [{"text": "An answer."}]}))
    (tmp_path / "keel.toml").write_text("max_tool_calls = 7\n")
    trust(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KEEL_DEADLINE", "120")
    store = tmp_path / "runs.sqlite"
    args = ["--model", f"script:{script}", "--repo", str(tmp_path), "--store", str(store)]
    result = runner.invoke(app, ["run", "q", *args, "--max-model-calls", "4", "--json"])
    assert result.exit_code == 0, result.output
    run_id = json.loads(result.stdout)["run_id"]
    db = Store(store)
    try:
        record = db.get_run(run_id)
    finally:
        db.close()
    assert record is not None
    limits = record.config.limits
    assert (limits.max_model_calls, limits.max_tool_calls, limits.deadline) == (4, 7, 120.0)
    shown = runner.invoke(app, ["show", run_id, "--store", str(store)])
    assert shown.exit_code == 0, shown.output
    line = next(x for x in shown.stdout.splitlines() if x.startswith("options: "))
    assert "max_model_calls 4 (--max-model-calls)" in line
    assert f"max_tool_calls 7 ({tmp_path / 'keel.toml'})" in line
    assert "deadline 120.0 (KEEL_DEADLINE)" in line
    assert "model script:" in line
    shown_json = runner.invoke(app, ["show", run_id, "--store", str(store), "--json"])
    as_json = json.loads(shown_json.stdout)
    assert as_json["options"]["max_tool_calls"] == {
        "from": str(tmp_path / "keel.toml"),
        "value": 7,
    }


def test_the_library_builds_an_agent_from_the_same_options_as_the_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "notes.md").write_text("notes\n")
    script = tmp_path / "script.json"
    read = {"tool_calls": [{"name": "read_file", "arguments": {"path": "notes.md"}}]}
    script.write_text(json.dumps({"turns": [read, {"text": "It says notes."}]}))
    monkeypatch.setenv("KEEL_LOOP_THRESHOLD", "4")
    agent = keel.agent_from_options(
        model=f"script:{script}", repo=tmp_path, store=str(tmp_path / "runs.sqlite"),
        max_model_calls=6, allow_writes=True,
    )  # fmt: skip
    with agent:
        assert {"read_file", "write_file"} <= {t.name for t in agent.tools}
        assert (agent.limits.max_model_calls, agent.limits.loop_threshold) == (6, 4)
        result = agent.run("What do the notes say?")
        assert (result.status, result.answer) == ("completed", "It says notes.")
        record = agent.store.get_run(result.run_id)
        assert record is not None
        assert record.config.settings["options"]["loop_threshold"] == {
            "from": "KEEL_LOOP_THRESHOLD", "value": 4,
        }  # fmt: skip
    with pytest.raises(ConfigError, match=r"no run option 'max_modell_calls'.*'max_model_calls'"):
        keel.agent_from_options(max_modell_calls=3)
