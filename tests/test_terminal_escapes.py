"""No command lets a model drive the user's terminal (ADR 0065): an answer, a tool call's
arguments and a failure message are untrusted text, and the escape sequences in them (a window
title, a screen clear, a hyperlink, colours, an 8-bit CSI) never reach a terminal raw. Each
command that prints such text (`keel run`, streamed and not, `keel show`, `keel runs`, `keel
ask`) runs under a pseudo-terminal here, and every byte it wrote is searched. (`keel replay`
is another helper's; it has its own test.)"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

import keel
from terminal_screen import Screen, run_on_a_terminal

SRC = str(Path(__file__).resolve().parents[1] / "src")
PROVIDER_KEYS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "KEEL_MODEL", "KEEL_STORE")

HOSTILE = (
    "Port 8421.\x1b]0;pwned-title\x07\x1b[2J\x1b[31mred-text\x1b[0m "
    "\x1b]8;;http://evil.example/\x1b\\click-here\x1b]8;;\x1b\\ \u009b1;1Hcsi8 end"
)
"""An answer with an OSC title, a clear screen, colours, an OSC 8 hyperlink, an 8-bit CSI."""
RAW = (b"\x1b]0;pwned", b"\x1b[2J", b"\x1b[31mred-text", b"\x1b]8;;http://evil", b"\xc2\x9b1;1H")
"""What must never be among the bytes a command writes."""


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in PROVIDER_KEYS}
    path = os.pathsep.join(p for p in (SRC, os.environ.get("PYTHONPATH")) if p)
    return env | {"PYTHONPATH": path, "XDG_DATA_HOME": str(tmp_path / "data")}


def _script(tmp_path: Path, stream_ms: float | None) -> Path:
    turns = [
        {"tool_calls": [{"name": "read_file", "arguments": {"path": "\x1b]0;pwned-arg\x07n.md"}}]},
        {"text": HOSTILE},
    ]
    script: dict[str, object] = {"turns": turns}
    if stream_ms is not None:
        script["stream_ms"] = stream_ms
    path = tmp_path / f"model-{stream_ms}.json"
    path.write_text(json.dumps(script))
    return path


def _keel(tmp_path: Path, *args: str) -> Screen:
    command = [sys.executable, "-m", "keel", *args, "--store", str(tmp_path / "runs.db")]
    return run_on_a_terminal(command, cwd=tmp_path, env=_env(tmp_path), timeout=120)


def _clean(screen: Screen, what: str) -> None:
    found = [seq for seq in RAW if seq in screen.raw]
    assert found == [], f"{what} wrote {found} raw: {screen.raw[-600:]!r}"


def _run(tmp_path: Path, stream_ms: float | None) -> str:
    (tmp_path / "repo").mkdir(exist_ok=True)
    model, repo = f"script:{_script(tmp_path, stream_ms)}", str(tmp_path / "repo")
    screen = _keel(tmp_path, "run", "Which port?", "--model", model, "--repo", repo)
    _clean(screen, f"keel run (stream_ms={stream_ms})")
    assert screen.shows("Port 8421."), screen.text
    store = keel.Store(tmp_path / "runs.db")
    try:
        (record,) = store.list_runs(1)
    finally:
        store.close()
    return record.run_id


@pytest.mark.parametrize("stream_ms", [5, None], ids=["streamed", "not-streamed"])
def test_keel_run_writes_no_escape_sequence_of_the_answer(
    tmp_path: Path, stream_ms: float | None
) -> None:
    _run(tmp_path, stream_ms)


def test_keel_show_runs_and_ask_write_no_escape_sequence_of_the_record(tmp_path: Path) -> None:
    run_id = _run(tmp_path, None)
    shown = _keel(tmp_path, "show", run_id)
    _clean(shown, "keel show")
    assert shown.shows("Port 8421."), shown.text
    _clean(_keel(tmp_path, "runs"), "keel runs")
    asked = _keel(tmp_path, "ask", run_id, "And the host?", "--model",
                  f"script:{_script(tmp_path, 5)}", "--repo", str(tmp_path / "repo"))  # fmt: skip
    _clean(asked, "keel ask")
    assert asked.shows("Port 8421."), asked.text


def test_a_failure_message_from_the_provider_reaches_the_terminal_scrubbed(
    tmp_path: Path,
) -> None:
    script = tmp_path / "fails.json"
    script.write_text(json.dumps({"turns": [{"error": {"status": 400, "message": HOSTILE}}]}))
    (tmp_path / "repo").mkdir()
    failed = _keel(tmp_path, "run", "Which port?", "--model", f"script:{script}",
                   "--repo", str(tmp_path / "repo"))  # fmt: skip
    _clean(failed, "keel run (failed)")
    assert failed.returncode != 0 and failed.shows("Port 8421."), failed.text


def test_the_check_sees_a_raw_sequence(tmp_path: Path) -> None:
    """The search can fail: a program that prints the answer as it is is caught."""
    code = f"import sys; sys.stdout.write({HOSTILE!r})"
    screen = run_on_a_terminal([sys.executable, "-c", code], cwd=tmp_path, env=_env(tmp_path))
    with pytest.raises(AssertionError, match="wrote"):
        _clean(screen, "print")
