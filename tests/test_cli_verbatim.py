"""What the command line prints about a run shows untrusted text as it came (issue 25).

A provider's error message, a tool's name and a model's words reach the summary line on
stderr; rich's console turned emoji codes in them (``:thumbs_up:``) into pictures, so the line
said something other than what the provider sent.
"""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from keel.cli.app import app


def test_the_summary_line_shows_emoji_codes_as_text(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    error = {"status": 400, "message": "bad request :thumbs_up: :smile:"}
    script.write_text(json.dumps({"turns": [{"error": error}]}))
    store = str(tmp_path / "runs.db")
    args = ["run", "q", "--model", f"script:{script}", "--repo", str(tmp_path), "--store", store]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1, result.stderr
    assert "bad request :thumbs_up: :smile:" in result.stderr
    assert "\U0001f44d" not in result.stderr
