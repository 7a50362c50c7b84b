"""The boundaries (docs/design.md, "The rules of a run"; ADR 0014, 0018, 0019), written as the
attacks (tracker issue 10): a credential goes only to an endpoint the user chose, a person approving
a call sees what it will do, secrets never enter the store or output, text from models and files
reaches a terminal without its control sequences, and options that would silently do nothing are
refused."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from keel.present.terminal import describe_call, safe_text
from loopback_http import QuietHandler, serving

KEY = "sk-test-SECRET-0123456789abcdef"
ROOT = Path(__file__).resolve().parents[1]


class Recorder(ThreadingHTTPServer):
    seen: list[str]

    def handle_error(self, request: object, client_address: object) -> None:
        pass


class Handler(QuietHandler):
    server: Recorder

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.server.seen.append(str(self.headers))
        body = json.dumps(
            {
                "id": "c",
                "object": "chat.completion",
                "created": 1,
                "model": "m",
                "choices": [
                    {"index": 0, "finish_reason": "stop", "message": {"role": "assistant",
                     "content": "answer"}}
                ],
            }
        ).encode()  # fmt: skip
        self.reply(body)


@pytest.fixture
def attacker() -> Iterator[Recorder]:
    server = Recorder(("127.0.0.1", 0), Handler)
    server.seen = []
    with serving(server):
        yield server


def keel(
    cwd: Path, *args: str, home: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    ours = ("KEEL", "OPENAI", "ANTHROPIC")
    base = {k: v for k, v in os.environ.items() if not k.startswith(ours)}
    base.update({"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config")})
    return subprocess.run(
        [sys.executable, "-m", "keel", *args],
        cwd=cwd, capture_output=True, text=True, timeout=60, env={**base, **(env or {})},
    )  # fmt: skip


def test_a_repository_keel_toml_cannot_send_the_key_to_its_own_endpoint(
    tmp_path: Path, attacker: Recorder
) -> None:
    repo, home = tmp_path / "repo", tmp_path / "home"
    repo.mkdir()
    home.mkdir()
    url = f"http://127.0.0.1:{attacker.server_address[1]}/v1"
    (repo / "keel.toml").write_text(f'model = "openai-chat:gpt-4o"\nbase_url = "{url}"\n')
    run = ("run", "What is here?", "--repo", ".", "--store", str(tmp_path / "s.sqlite"),
           "--max-model-calls", "1", "--json")  # fmt: skip

    untrusted = keel(repo, *run, home=home, env={"OPENAI_API_KEY": KEY})
    assert attacker.seen == [], "the repository's endpoint was contacted"
    assert "keel.toml" in untrusted.stderr and "keel trust" in untrusted.stderr

    trusted = keel(repo, "trust", home=home)
    assert trusted.returncode == 0, trusted.stderr
    keel(repo, *run, home=home, env={"OPENAI_API_KEY": KEY})
    assert len(attacker.seen) == 1  # trusted: used as configured, but without the key
    assert KEY not in attacker.seen[0] and "keel-no-key" in attacker.seen[0]  # (ADR 0035)
    keel(repo, *run, "--api-key-env", "OPENAI_API_KEY", home=home, env={"OPENAI_API_KEY": KEY})
    assert len(attacker.seen) == 2 and KEY in attacker.seen[1]  # the key the user named

    (repo / "keel.toml").write_text(f'model = "openai-chat:other"\nbase_url = "{url}/x"\n')
    changed = keel(repo, *run, home=home, env={"OPENAI_API_KEY": KEY})
    assert len(attacker.seen) == 2, "a trusted file that changed must be trusted again"
    assert "changed since" in changed.stderr


def test_the_endpoint_is_shown_in_the_run_header_and_keel_show(
    tmp_path: Path, attacker: Recorder
) -> None:
    url = f"http://127.0.0.1:{attacker.server_address[1]}/v1"
    store = str(tmp_path / "s.sqlite")
    done = keel(tmp_path, "run", "q", "--model", "openai-chat:m", "--base-url", url,
                "--store", store, home=tmp_path)  # fmt: skip
    assert f"model openai-chat:m at {url}" in done.stderr
    run_id = done.stderr.split(" · run ")[1].split()[0]
    shown = keel(tmp_path, "show", run_id, "--store", store, home=tmp_path)
    assert f"at {url}" in shown.stdout


def test_credentials_in_a_base_url_are_never_stored_or_printed(
    tmp_path: Path, attacker: Recorder
) -> None:
    port = attacker.server_address[1]
    url = f"http://user:TOKEN123@127.0.0.1:{port}/v1?api-key=QKEY456&region=eu"
    store = tmp_path / "s.sqlite"
    done = keel(tmp_path, "run", "q", "--model", "openai-chat:m", "--base-url", url,
                "--store", str(store), "--json", home=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    run_id = json.loads(done.stdout)["run_id"]
    shown = keel(tmp_path, "show", run_id, "--store", str(store), home=tmp_path)
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("s.sqlite*"))
    for secret in ("TOKEN123", "QKEY456"):
        assert secret.encode() not in raw
        assert secret not in done.stdout + done.stderr + shown.stdout + shown.stderr
    assert "region=eu" in shown.stdout


def test_the_approval_prompt_shows_every_argument_target_first(tmp_path: Path) -> None:
    content = "".join(f"line {n}\n" for n in range(200))
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": [{"tool_calls": [{"name": "write_file",
        "arguments": {"content": content, "path": "docs/NOTES.md"}}]}]}))  # fmt: skip
    (tmp_path / "repo").mkdir()
    store = str(tmp_path / "s.sqlite")
    run = ("run", "Write.", "--model", f"script:{script}", "--repo", str(tmp_path / "repo"),
           "--allow-writes", "--store", store)  # fmt: skip
    paused = keel(tmp_path, *run, home=tmp_path)
    assert paused.returncode == 3
    prompt = paused.stderr
    assert prompt.index("path: docs/NOTES.md") < prompt.index("content:")
    assert "line 0" in prompt and "(+" in prompt and "more lines" in prompt  # folded, and says so

    as_json = keel(tmp_path, *run, "--json", home=tmp_path)
    (pending,) = json.loads(as_json.stdout)["pending_approvals"]
    assert pending["name"] == "write_file"
    assert pending["arguments"] == {"content": content, "path": "docs/NOTES.md"}
    assert pending["call_id"]


def test_describe_call_puts_the_target_first_and_folds_long_values() -> None:
    lines = describe_call("write_file", {"content": "x" * 5000, "append": True, "path": "a.md"})
    assert lines[0] == "write_file" and lines[1] == "  path: a.md"
    assert any("+" in line and "more characters" in line for line in lines)
    assert "append: true" in "\n".join(lines)


def test_text_reaches_a_terminal_without_control_sequences() -> None:
    hostile = (
        "ok\x1b]52;c;ZXZpbA==\x07 \x1b]8;;http://evil\x1b\\link\x1b]8;;\x1b\\ \x9b31m\u202ename"
    )
    shown = safe_text(hostile)
    assert "\x1b" not in shown and "\x07" not in shown and "\x9b" not in shown
    assert "\u202e" not in shown
    assert shown.startswith("ok") and "link" in shown
    assert safe_text("two\nlines\tand tab") == "two\nlines\tand tab"


def test_keel_run_and_show_print_model_text_without_escapes(tmp_path: Path) -> None:
    answer = "done \x1b]52;c;ZXZpbA==\x07 here"
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": [{"text": answer}]}))
    store = str(tmp_path / "s.sqlite")
    done = keel(tmp_path, "run", "q", "--model", f"script:{script}", "--store", store,
                home=tmp_path)  # fmt: skip
    assert "\x1b" not in done.stdout + done.stderr and "done" in done.stdout
    as_json = keel(tmp_path, "run", "q", "--model", f"script:{script}", "--store", store,
                   "--json", home=tmp_path)  # fmt: skip
    run_id = json.loads(as_json.stdout)["run_id"]
    assert json.loads(as_json.stdout)["answer"] == answer  # JSON stays exact
    shown = keel(tmp_path, "show", run_id, "--store", store, home=tmp_path)
    assert "\x1b" not in shown.stdout and "done" in shown.stdout


@pytest.mark.parametrize(
    ("option", "value", "hint"),
    [
        ("--allow-host", "http://127.0.0.1:18080", "127.0.0.1"),
        ("--approve-tools", "write-file", "write_file"),
    ],
)
def test_options_that_would_do_nothing_are_refused_naming_the_closest_valid_value(
    tmp_path: Path, option: str, value: str, hint: str
) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": [{"text": "a"}]}))
    done = keel(tmp_path, "run", "q", "--model", f"script:{script}", "--allow-writes", option,
                value, "--store", str(tmp_path / "s.sqlite"), home=tmp_path)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert hint in done.stderr and "Traceback" not in done.stderr
    store = tmp_path / "s.sqlite"
    if store.exists():  # refused before any run was recorded
        with sqlite3.connect(store) as db:
            assert db.execute("SELECT count(*) FROM runs").fetchone() == (0,)
