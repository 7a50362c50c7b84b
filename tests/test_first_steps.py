"""A newcomer's first steps (issue 26): `make run` and `keel runs` agree on the store, an empty
question is refused, `keel models` says where the model file is, `keel run` names the folder
`--repo` defaulted to, and `--model local:PATH` loads another GGUF file."""

from __future__ import annotations

import importlib.util
import json
import os
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from keel.cli.app import app
from keel.models import choose_model, model_file_line, resolve_model
from keel.transports.local import DEFAULT_NAME, LocalTransport
from keel.transports.local.weights import (
    QWEN25_CODER_05B,
    QWEN25_CODER_15B,
    install_hint,
    is_installed,
)

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()


def recipe(target: str) -> str:
    """The command lines of one Makefile target, joined where they continue."""
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    block = text.split(f"\n{target}:", 1)[1]
    lines = []
    for line in block.splitlines()[1:]:
        if not line.startswith("\t"):
            break
        lines.append(line)
    return "\n".join(lines)


@pytest.mark.parametrize("target", ["run", "demo"])
def test_make_run_uses_the_store_keel_runs_and_keel_show_find(target: str) -> None:
    """`keel runs` right after `make run` said there was no store: make used .venv/demo.sqlite.
    Both targets now store where every command looks by default."""
    commands = recipe(target)
    assert "keel run" in commands
    assert "--store" not in commands


def test_keel_runs_finds_the_run_make_run_stored(tmp_path: Path) -> None:
    """The default store of `keel run` is the one `keel runs` reads."""
    (tmp_path / "notes.md").write_text("A lease is held by one process.\n")
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": [{"text": "It is held by one process."}]}))
    env = {"XDG_DATA_HOME": str(tmp_path / "data"), "KEEL_STORE": ""}
    ran = runner.invoke(app, ["run", "q", "--model", f"script:{script}", "--repo", str(tmp_path)],
                        env=env)
    assert ran.exit_code == 0, ran.stderr
    listed = runner.invoke(app, ["runs"], env=env)
    assert listed.exit_code == 0, listed.stderr
    run_id = re.search(r"run (run_\w+)", ran.stderr)
    assert run_id is not None and run_id.group(1) in listed.stdout


@pytest.mark.parametrize("question", ["", "   ", "\n\t "])
def test_an_empty_question_is_refused_with_exit_2(tmp_path: Path, question: str) -> None:
    """`keel run ""` was accepted and ran for 78 s."""
    store = tmp_path / "s.sqlite"
    result = runner.invoke(app, ["run", question, "--model", "local", "--store", str(store)])
    assert result.exit_code == 2
    assert "the question is empty" in result.stderr
    assert not store.exists()  # refused before anything was opened or recorded


def test_keel_models_prints_the_model_files_path_and_size(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    result = runner.invoke(app, ["models"], env={"XDG_CACHE_HOME": str(cache)})
    assert result.exit_code == 0, result.stderr
    expected = cache / "keel" / "models" / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"  # `local`
    assert f"local model file: {expected} (not joined yet" in result.stdout
    expected.parent.mkdir(parents=True)
    expected.write_bytes(b"x" * 3_000_000)
    result = runner.invoke(app, ["models"], env={"XDG_CACHE_HOME": str(cache)})
    assert f"local model file: {expected} (3,000,000 bytes, 3 MiB)" in result.stdout


def test_keel_models_names_the_file_a_local_path_spec_points_at(tmp_path: Path) -> None:
    gguf = tmp_path / "other.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 1020)
    assert model_file_line(f"local:{gguf}") == f"{gguf} (1,024 bytes, 0 MiB)"
    result = runner.invoke(app, ["models"], env={"KEEL_MODEL": f"local:{gguf}"})
    assert f"local model file: {gguf} (1,024 bytes" in result.stdout


def test_keel_models_lists_both_shipped_models_with_file_size_and_state(tmp_path: Path) -> None:
    """Issue 39: `keel models` names the 0.5B and the 1.5B, each with its file, its size and
    whether its parts are installed; `local:0.5b` as the default names the 0.5B's file.
    Issue 45: `local` is the 1.5B."""
    cache = tmp_path / "cache"
    result = runner.invoke(app, ["models"], env={"XDG_CACHE_HOME": str(cache)})
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    small = next(line for line in lines if line[5:].startswith("local:0.5b "))
    large = next(line for line in lines if line[5:].startswith("local "))
    assert "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf (469 MiB)" in small
    assert "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf (1,066 MiB)" in large
    for line, model in ((small, QWEN25_CODER_05B), (large, QWEN25_CODER_15B)):
        installed = is_installed(model) and importlib.util.find_spec("llama_cpp") is not None
        assert line.startswith("yes" if installed else "no ")
        assert ("; installed" if installed else install_hint(model)) in line
    result = runner.invoke(
        app, ["models"], env={"XDG_CACHE_HOME": str(cache), "KEEL_MODEL": "local:0.5b"}
    )
    expected = cache / "keel" / "models" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    assert f"local model file: {expected} (not joined yet" in result.stdout


@pytest.mark.parametrize("spec", ["local:1.5b", "local:1.5B"])
def test_local_15b_spec_picks_the_shipped_15b_model(spec: str) -> None:
    transport = resolve_model(spec)
    assert isinstance(transport, LocalTransport)
    assert transport.model == "1.5b" and transport.model_path is None
    assert transport.name == "local:qwen2.5-coder-1.5b"
    assert resolve_model("local").name == resolve_model("local:1.5b").name == DEFAULT_NAME


@pytest.mark.parametrize("spec", ["local:0.5b", "local:0.5B"])
def test_local_05b_spec_still_picks_the_shipped_05b_model(spec: str) -> None:
    """Issue 45: `local` became the 1.5B; the 0.5B stays selectable by name."""
    transport = resolve_model(spec)
    assert isinstance(transport, LocalTransport)
    assert transport.model == "0.5b" and transport.model_path is None
    assert transport.name == "local:qwen2.5-coder-0.5b"


def test_keel_toml_can_choose_the_15b_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    (tmp_path / "config" / "keel").mkdir(parents=True)
    (tmp_path / "config" / "keel" / "keel.toml").write_text('model = "local:1.5b"\n')
    choice = choose_model(env={}, cwd=tmp_path)
    assert choice.spec == "local:1.5b"
    assert resolve_model(choice.spec).name == "local:qwen2.5-coder-1.5b"


def test_local_path_spec_loads_that_gguf_file(tmp_path: Path) -> None:
    """`--model local:PATH` (also KEEL_MODEL, keel.toml's model): another GGUF file instead of
    the shipped one, loaded as it is; a missing file says so when the run starts."""
    transport = resolve_model(f"local:{tmp_path}/mine.gguf")
    assert isinstance(transport, LocalTransport)
    assert transport.model_path == f"{tmp_path}/mine.gguf"
    assert transport.name == "local:mine"
    with pytest.raises(Exception, match="local model file not found"):
        transport.prepare()
    home = resolve_model("local:~/m.gguf")
    assert isinstance(home, LocalTransport) and home.model_path == os.path.expanduser("~/m.gguf")


def test_keel_run_says_which_folder_repo_defaulted_to(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": [{"text": "done"}]}))
    args = ["run", "q", "--model", f"script:{script}", "--store", str(tmp_path / "s.sqlite")]
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        defaulted = runner.invoke(app, args)
        chosen = runner.invoke(app, [*args, "--repo", str(tmp_path)])
    finally:
        os.chdir(cwd)
    assert defaulted.exit_code == 0, defaulted.stderr
    assert f"repo: {tmp_path.resolve()} (the current folder; --repo DIR to choose)" in (
        defaulted.stderr
    )
    assert "repo:" not in chosen.stderr  # chosen on purpose: nothing to point out
