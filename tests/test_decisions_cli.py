"""The four decisions from the command line (ADR 0052): `keel approve --arguments`,
`keel approve --for-run`, `keel answer`, `keel run --approval-timeout`, and `keel show`."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from keel.cli.app import app

runner = CliRunner()


def keel(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def write(path: str, content: str) -> dict[str, Any]:
    return {"tool_calls": [{"name": "write_file", "arguments": {"path": path, "content": content}}]}


def start(tmp_path: Path, turns: list[dict[str, Any]], *extra: str) -> tuple[str, str, Path]:
    repo = tmp_path / "repo"
    repo.mkdir(exist_ok=True)
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": turns}))
    store = str(tmp_path / "runs.sqlite")
    code, out, err = keel(
        "run", "Write.", "--model", f"script:{script}", "--repo", str(repo), "--allow-writes",
        "--store", store, "--json", *extra,
    )  # fmt: skip
    assert code == 3, err
    return json.loads(out)["run_id"], store, repo


def test_keel_approve_with_edited_arguments_runs_them_and_keel_show_has_both(
    tmp_path: Path,
) -> None:
    run_id, store, repo = start(tmp_path, [write("a.md", "draft"), {"text": "done"}])
    code, _, err = keel("approve", run_id, "k1_0", "--arguments", '{"path": "a.md"}',
                        "--store", store)  # fmt: skip
    assert code == 2 and "content" in err  # the schema wants content: nothing recorded
    code, _, err = keel("approve", run_id, "k1_0", "--arguments", "[1]", "--store", store)
    assert code == 2 and "JSON object" in err
    edited = '{"path": "b.md", "content": "final"}'
    code, out, err = keel("approve", run_id, "k1_0", "--arguments", edited, "--store", store)
    assert code == 0, err
    assert "approved k1_0 with edited arguments" in out
    code, _, err = keel("resume", run_id, "--store", store)
    assert code == 0, err
    assert (repo / "b.md").read_text() == "final" and not (repo / "a.md").exists()
    code, shown, _ = keel("show", run_id, "--store", store)
    assert "with edited arguments" in shown and "final" in shown and "draft" in shown


def test_keel_approve_for_run_and_keel_answer(tmp_path: Path) -> None:
    turns = [write("a.md", "one"), write("b.md", "two"), write("c.md", "three"), {"text": "ok"}]
    run_id, store, repo = start(tmp_path, turns)
    code, out, err = keel("approve", run_id, "k1_0", "--for-run", "--store", store)
    assert code == 0 and "for the rest of the run" in out, err
    code, out, err = keel("resume", run_id, "--store", store, "--json")
    assert code == 0, err  # b.md and c.md needed nobody
    assert [p.name for p in sorted(repo.iterdir())] == ["a.md", "b.md", "c.md"]
    code, shown, _ = keel("show", run_id, "--store", store, "--json")
    (decided,) = [e for e in json.loads(shown)["events"] if e["type"] == "approval_decided"]
    assert decided["for_run"] is True and decided["call_id"] == "k1_0"

    other = tmp_path / "other"
    other.mkdir()
    run_id, store, repo = start(other, [write("a.md", "x"), {"text": "ok"}])
    code, out, err = keel("answer", run_id, "k1_0", "Already written by hand.", "--by", "ana",
                          "--store", store)  # fmt: skip
    assert code == 0 and "answered k1_0" in out, err
    code, out, err = keel("resume", run_id, "--store", store, "--json")
    assert code == 0, err
    assert json.loads(out)["tool_calls"] == 0 and not (repo / "a.md").exists()
    code, shown, _ = keel("show", run_id, "--store", store)
    assert "answered instead by ana" in shown
    code, _, err = keel("approve", run_id, "k1_0", "--store", store)
    assert code == 2 and "already" in err


def test_keel_run_approval_timeout_denies_a_late_approval(tmp_path: Path) -> None:
    run_id, store, repo = start(tmp_path, [write("a.md", "x"), {"text": "without it"}],
                                "--approval-timeout", "0.05")  # fmt: skip
    time.sleep(0.1)
    code, _, err = keel("approve", run_id, "k1_0", "--store", store)
    assert code == 2 and "approval timeout" in err
    code, out, err = keel("resume", run_id, "--store", store, "--json")
    assert code == 0, err
    assert json.loads(out)["answer"] == "without it" and not (repo / "a.md").exists()


def test_keel_ui_shows_an_edited_approval_and_an_answer(tmp_path: Path) -> None:
    from starlette.testclient import TestClient

    from keel.ui.app import create_app
    from keel.ui.security import served_hosts

    run_id, store, _ = start(tmp_path, [write("a.md", "draft"), {"text": "done"}])
    edited = '{"path": "b.md", "content": "final"}'
    assert keel("approve", run_id, "k1_0", "--arguments", edited, "--store", store)[0] == 0
    other = tmp_path / "other"
    other.mkdir()
    answered, store_b, _ = start(other, [write("a.md", "x"), {"text": "ok"}])
    assert keel("answer", answered, "k1_0", "By hand.", "--store", store_b)[0] == 0
    for target, run, said in ((store, run_id, "with edited arguments"),
                              (store_b, answered, "By hand.")):  # fmt: skip
        app = create_app(Path(target), served_hosts("127.0.0.1", 8350))
        with TestClient(app, base_url="http://127.0.0.1:8350") as ui:
            page = ui.get(f"/runs/{run}")
        assert page.status_code == 200 and said in page.text
