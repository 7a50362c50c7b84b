"""What a newcomer sees: help text with its defaults, a one-line summary after the answer, the
exact `keel show` command for the run (with the store it was saved in), and the pinned sampling
in `keel show`."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from typer.testing import CliRunner

import keel
from keel.cli.app import app
from keel.messages import ModelRequest, ModelResponse

runner = CliRunner()


def test_help_keeps_its_defaults_and_whole_option_names() -> None:
    result = runner.invoke(app, ["run", "--help"], env={"COLUMNS": "80"}, terminal_width=80)
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())  # the help wraps at 80 columns
    assert "[default: see `keel models`]" in text  # was swallowed as Rich markup
    assert "[default: KEEL_STORE, keel.toml, else a file under the user data directory]" in text
    for option in ("--evidence-reset-cap", "--first-turn-tool", "--context-tokens"):
        assert option in text  # was cut to "--evidence-reset-c…" at 80 columns
    assert "…" not in text


def test_run_prints_a_summary_and_the_exact_show_command(tmp_path: Path) -> None:
    (tmp_path / "notes.md").write_text("The breaker counts identical calls.\n")
    script = tmp_path / "script.json"
    read = {"tool_calls": [{"name": "read_file", "arguments": {"path": "notes.md"}}]}
    script.write_text(json.dumps({"turns": [read, read, {"text": "It counts calls."}]}))
    store = tmp_path / "demo.sqlite"
    args = ["run", "q", "--model", f"script:{script}", "--repo", str(tmp_path)]
    result = runner.invoke(app, [*args, "--store", str(store)])
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == "It counts calls."
    assert "tools called: read_file x2 · answer: not synthesized" in result.stderr
    command = result.stderr.split("open it with: ")[1].strip()
    words = shlex.split(command)
    assert words[:2] == ["keel", "show"] and words[3:] == ["--store", str(store)]
    shown = runner.invoke(app, words[1:])  # the printed command opens the run
    assert shown.exit_code == 0, shown.stderr
    assert "It counts calls." in shown.stdout


class Pinned:
    name = "pinned"

    def __init__(self) -> None:
        self.sampling = {"temperature": 0.0, "top_p": 0.8, "seed": 7}

    async def request(self, request: ModelRequest) -> ModelResponse:
        return ModelResponse("answer")


def test_show_prints_the_pinned_sampling(tmp_path: Path) -> None:
    store = tmp_path / "runs.sqlite"
    with keel.Agent(Pinned(), store=store) as agent:
        run_id = agent.run("q").run_id
    shown = runner.invoke(app, ["show", run_id, "--store", str(store)])
    assert "sampling: temperature 0.0, top_p 0.8, seed 7" in shown.stdout
    shown_json = runner.invoke(app, ["show", run_id, "--store", str(store), "--json"])
    as_json = json.loads(shown_json.stdout)
    assert as_json["sampling"] == {"temperature": 0.0, "top_p": 0.8, "seed": 7}


def test_the_token_meter_reports_the_prompt_apart_from_the_tokens_per_second() -> None:
    import io

    from rich.console import Console

    from keel.messages import Usage
    from keel.present.progress import TokenMeter
    from keel.present.screen import Screen
    from keel.records import ModelRequestSent, ModelResponseReceived

    out = io.StringIO()
    meter = TokenMeter(Screen(Console(file=out, width=200)))
    meter(ModelRequestSent(step=2, attempt=1, tool_choice=None, synthesis=None, items=3,
                           estimated_input_tokens=900))  # fmt: skip
    for n in range(1, 11):
        meter.tokens(n, (n - 1) * 0.1)  # 10 tokens, the last 9 in 0.9 s: 10 tokens/s
    meter(ModelResponseReceived(step=2, text="answer", usage=Usage(951, 10, 900)))
    line = out.getvalue().strip()
    assert line.startswith("[2] model: prompt 951 tokens (900 from the cache) in ")
    assert line.endswith("wrote 10 tokens at 10.0 tokens/s")
