"""The process edges a hostile probe broke (tracker issue 20): what comes from outside the run
never crashes it, never changes its outcome, and never ends in a traceback.

- stdout closed, a pipe whose reader left (`| head -1`), a full disk (`/dev/full`): the run
  goes on to its end and is stored; stderr says in one line that the output was not written.
- SIGINT, SIGTERM, SIGHUP, mid-run or before the run started: the documented exit code 1, the
  run recorded `cancelled` (never left `running`), no traceback.
- An async tool raising KeyboardInterrupt, SystemExit, GeneratorExit or a bare BaseException is
  one failed call; one that swallows its cancellation is abandoned at its timeout or the run's
  deadline; the run's own cancellation still cancels.
- A misspelt `keel.toml` key is named on stderr with the closest valid key.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from isolated import run_python

SIGNALS = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP]


class Keel:
    """`python -m keel` in a folder of its own: a repo, a store, an empty user config."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.repo = tmp / "repo"
        self.repo.mkdir()
        (self.repo / "notes.md").write_text("".join(f"line {n}\n" for n in range(40)))
        self.store = tmp / "runs.sqlite"
        self.config = tmp / "config"
        (self.config / "keel").mkdir(parents=True)

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KEEL", "OPENAI"))}
        env["XDG_CONFIG_HOME"] = str(self.config)
        env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
        return env

    def model(self, turns: int, latency_ms: int = 0) -> str:
        calls: list[dict[str, Any]] = [
            {"tool_calls": [{"name": "read_file", "arguments": {"path": "notes.md",
                                                                  "start_line": n + 1}}]}
            for n in range(turns)
        ]  # fmt: skip
        path = self.tmp / "script.json"
        path.write_text(
            json.dumps({"turns": [*calls, {"text": "Read."}], "latency_ms": latency_ms})
        )
        return f"script:{path}"

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "keel", *args, "--store", str(self.store)]

    def run_argv(self, model: str, *flags: str) -> list[str]:
        return self.argv("run", "Read the notes.", "--model", model, "--repo", str(self.repo),
                         *flags)  # fmt: skip

    def stored(self) -> list[str]:
        if not self.store.exists():
            return []
        try:
            with sqlite3.connect(f"file:{self.store}?mode=ro", uri=True, timeout=5) as db:
                return [str(row[0]) for row in db.execute("SELECT status FROM runs")]
        except sqlite3.Error:  # not created yet
            return []

    def run_ids(self) -> list[str]:
        with sqlite3.connect(f"file:{self.store}?mode=ro", uri=True, timeout=5) as db:
            return [str(row[0]) for row in db.execute("SELECT run_id FROM runs")]


@pytest.fixture
def keel(tmp_path: Path) -> Keel:
    return Keel(tmp_path)


def no_traceback(stderr: str) -> None:
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr


def keel_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("keel:")]


# -- 1. stdout closed, broken or full ------------------------------------------------------


def test_events_into_a_pipe_whose_reader_left_end_quietly_and_the_run_completes(
    keel: Keel,
) -> None:
    """`keel run --events | head -1`: the reader goes after one line; the run does not."""
    proc = subprocess.Popen(
        keel.run_argv(keel.model(6, latency_ms=60), "--events"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=keel.env(),
        cwd=keel.tmp,
    )
    assert proc.stdout is not None and proc.stderr is not None
    first = json.loads(proc.stdout.readline())
    proc.stdout.close()  # what head -1 does
    err = proc.stderr.read()
    code = proc.wait(60)
    assert first["type"] == "run_started"
    no_traceback(err)
    assert code == 0, err
    assert keel.stored() == ["completed"]
    (run_id,) = keel.run_ids()
    (line,) = keel_lines(err)
    assert "stdout" in line and run_id in line, line


@pytest.mark.parametrize("form", ["--json", "--events", "--human"])
def test_output_to_a_full_disk_is_one_line_on_stderr_and_the_run_is_stored(
    keel: Keel, form: str
) -> None:
    flags = [] if form == "--human" else [form]
    with open("/dev/full", "w") as full:
        proc = subprocess.run(
            keel.run_argv(keel.model(3), *flags),
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            env=keel.env(),
            cwd=keel.tmp,
            timeout=60,
        )
    no_traceback(proc.stderr)
    assert proc.returncode == 0, proc.stderr
    assert keel.stored() == ["completed"]
    (run_id,) = keel.run_ids()
    (line,) = keel_lines(proc.stderr)
    assert "No space left on device" in line and run_id in line, line


@pytest.mark.parametrize("form", ["--json", "--human"])
def test_a_closed_stdout_says_where_the_result_went(keel: Keel, form: str) -> None:
    """`keel run … >&-`: the result cannot be printed; it must not vanish without a word."""
    flags = [] if form == "--human" else [form]
    proc = subprocess.run(
        ["sh", "-c", 'exec "$@" >&-', "sh", *keel.run_argv(keel.model(2), *flags)],
        stderr=subprocess.PIPE,
        text=True,
        env=keel.env(),
        cwd=keel.tmp,
        timeout=60,
    )
    no_traceback(proc.stderr)
    assert proc.returncode == 0, proc.stderr
    assert keel.stored() == ["completed"]
    (run_id,) = keel.run_ids()
    (line,) = keel_lines(proc.stderr)
    assert "stdout" in line and run_id in line and "keel show" in line, line


# -- 2. signals ----------------------------------------------------------------------------


def wait_for(predicate: Any, what: str, seconds: float = 30) -> None:
    until = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > until:
            raise AssertionError(f"{what} did not happen within {seconds} s")
        time.sleep(0.02)


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_a_signal_mid_run_cancels_it_records_it_and_exits_1(
    keel: Keel, sig: signal.Signals
) -> None:
    proc = subprocess.Popen(
        keel.run_argv(keel.model(40, latency_ms=100), "--json"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=keel.env(),
        cwd=keel.tmp,
    )
    try:
        wait_for(lambda: keel.stored() == ["running"], "the run's start")
        time.sleep(0.3)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
    no_traceback(err)
    assert proc.returncode == 1, (proc.returncode, err)
    assert json.loads(out)["status"] == "cancelled"
    assert keel.stored() == ["cancelled"]


@pytest.mark.parametrize("gap", [0.0, 0.003, 0.02])
def test_ctrl_c_pressed_twice_still_prints_the_result_and_exits_1(keel: Keel, gap: float) -> None:
    """The second SIGINT lands while the run is being cancelled, printed or while the process
    exits: none of these may change the exit code or lose the result."""
    proc = subprocess.Popen(
        keel.run_argv(keel.model(40, latency_ms=100), "--json"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=keel.env(),
        cwd=keel.tmp,
    )
    try:
        wait_for(lambda: keel.stored() == ["running"], "the run's start")
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        time.sleep(gap)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
    no_traceback(err)
    assert proc.returncode == 1, (proc.returncode, err)
    assert json.loads(out)["status"] == "cancelled"
    assert keel.stored() == ["cancelled"]


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_a_signal_before_the_run_started_exits_1_in_one_line(
    keel: Keel, sig: signal.Signals
) -> None:
    """The signal comes while `keel run` waits for an MCP server to start: no run exists yet."""
    started = keel.tmp / "server-started"
    server = (
        f"{sys.executable} -c \"import pathlib, sys; pathlib.Path('{started}').touch(); "
        'sys.stdin.read()"'
    )
    proc = subprocess.Popen(
        keel.run_argv(keel.model(2), "--json", "--mcp", server),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=keel.env(),
        cwd=keel.tmp,
    )
    try:
        wait_for(started.exists, "the MCP server's start")
        signalled = time.monotonic()
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
    no_traceback(err)
    assert proc.returncode == 1, (proc.returncode, err)
    assert time.monotonic() - signalled < 10
    assert out == ""
    (line,) = keel_lines(err)
    assert sig.name in line and "before the run started" in line, line
    assert "running" not in keel.stored()


def test_a_signal_after_the_run_ended_keeps_its_exit_code_though_stdout_is_blocked(
    keel: Keel,
) -> None:
    """The run has completed; its event lines fill a pipe nobody reads, so the command waits
    to write them. SIGTERM ends it at once, with the run's own code."""
    turns = [
        {"tool_calls": [{"name": "list_files", "arguments": {"path": ".", "pattern": f"*{n}"}}]}
        for n in range(150)
    ]
    script = keel.tmp / "many.json"
    script.write_text(json.dumps({"turns": [*turns, {"text": "Listed."}]}))
    proc = subprocess.Popen(
        keel.run_argv(f"script:{script}", "--events", "--max-model-calls", "200",
                      "--max-tool-calls", "200", "--loop-threshold", "50"),
        stdout=subprocess.PIPE,  # never read: the pipe fills
        stderr=subprocess.PIPE,
        env=keel.env(),
        cwd=keel.tmp,
    )  # fmt: skip
    try:
        wait_for(lambda: keel.stored() == ["completed"], "the run's end")
        time.sleep(0.5)
        assert proc.poll() is None, "the output did not fill the pipe: nothing to test"
        proc.send_signal(signal.SIGTERM)
        assert proc.stderr is not None
        err = proc.stderr.read().decode()
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    no_traceback(err)
    assert proc.returncode == 0, (proc.returncode, err)


async def test_a_run_cancelled_before_its_task_began_is_recorded_cancelled(
    tmp_path: Path,
) -> None:
    """What a signal during `agent.start` (a model loading) comes to: cancel before the first
    await. The run still ends `cancelled` and is stored so, rather than raising."""
    import keel as keel_lib

    store = keel_lib.Store(tmp_path / "runs.sqlite")
    agent = keel_lib.Agent(
        keel_lib.ScriptedTransport.from_dict({"turns": [{"text": "never asked"}]}), store=store
    )
    handle = agent.start("What is a lease?")
    handle.cancel()
    result = await handle
    assert result.status == "cancelled"
    record = store.get_run(result.run_id)
    assert record is not None and record.status == "cancelled"
    assert result.model_calls == 0


# -- 3. async tools that raise what is not an Exception, or swallow their cancellation ------

TOOL_RUN = """
import asyncio, json, sys, time
import keel

KIND = {kind!r}

class Odd(BaseException):
    pass

@keel.tool(effect={effect!r}, timeout={timeout})
async def probe(n: int) -> str:
    '''Probe.'''
    if KIND == "KeyboardInterrupt":
        raise KeyboardInterrupt("from a tool")
    if KIND == "SystemExit":
        raise SystemExit(7)
    if KIND == "BaseException":
        raise Odd("from a tool")
    if KIND == "GeneratorExit":
        raise GeneratorExit("from a tool")
    while True:  # "swallow": cancellation is caught and ignored, forever
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            pass

store = keel.Store({store!r})
turns = [{{"tool_calls": [{{"name": "probe", "arguments": {{"n": 1}}}}]}}, {{"text": "went on"}}]
agent = keel.Agent(
    keel.ScriptedTransport.from_dict({{"turns": turns}}),
    tools=[probe],
    store=store,
    limits=keel.Limits(deadline={deadline}, retry_base_delay=0.001),
    approve_tools=["probe"],
)
started = time.monotonic()
CANCEL_AFTER = {cancel_after}

async def main():
    handle = agent.start("Probe it.")
    if CANCEL_AFTER is not None:
        await asyncio.sleep(CANCEL_AFTER)
        handle.cancel()
    return await handle

result = asyncio.run(main())
results = [e for e in store.events(result.run_id) if e.type == "tool_result"]
print(json.dumps({{
    "status": result.status,
    "stored": store.get_run(result.run_id).status,
    "failure": result.failure.kind if result.failure else None,
    "answer": result.answer,
    "results": [e.content for e in results],
    "uncertain": [e.uncertain for e in results],
    "seconds": time.monotonic() - started,
}}))
"""


def tool_run(
    tmp_path: Path,
    kind: str,
    *,
    effect: str = "read_only",
    timeout: float = 30,
    deadline: float | None = None,
    cancel_after: float | None = None,
) -> dict[str, Any]:
    code = TOOL_RUN.format(
        kind=kind,
        effect=effect,
        timeout=timeout,
        deadline=deadline,
        cancel_after=cancel_after,
        store=str(tmp_path / "runs.sqlite"),
    )
    proc = run_python(code, timeout=30)
    assert proc.returncode == 0, proc.stderr[-3000:]
    no_traceback(proc.stderr)
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


@pytest.mark.parametrize(
    "kind", ["KeyboardInterrupt", "SystemExit", "BaseException", "GeneratorExit"]
)
def test_an_async_tool_raising_a_base_exception_is_one_failed_call(
    tmp_path: Path, kind: str
) -> None:
    out = tool_run(tmp_path, kind)
    assert out["status"] == out["stored"] == "completed", out
    assert out["answer"] == "went on"
    (content,) = out["results"]
    shown = "Odd" if kind == "BaseException" else kind
    assert content.startswith("Error: probe failed") and shown in content, content


def test_an_async_tool_that_swallows_its_cancellation_is_abandoned_at_its_timeout(
    tmp_path: Path,
) -> None:
    out = tool_run(tmp_path, "swallow", timeout=0.3)
    assert out["status"] == out["stored"] == "completed", out
    (content,) = out["results"]
    assert "timed out" in content and "abandoned" in content, content
    assert out["seconds"] < 10


def test_a_side_effect_that_swallows_its_cancellation_is_effect_unknown(
    tmp_path: Path,
) -> None:
    out = tool_run(tmp_path, "swallow", effect="side_effecting", timeout=0.3)
    assert out["status"] == "completed", out
    assert out["uncertain"] == [True]
    assert out["results"][0].startswith("Effect unknown"), out["results"]


def test_a_tool_that_swallows_its_cancellation_cannot_keep_a_run_past_its_deadline(
    tmp_path: Path,
) -> None:
    out = tool_run(tmp_path, "swallow", timeout=30, deadline=1.0)
    assert out["status"] == out["stored"] == "failed", out
    assert out["failure"] == "DeadlineExceeded"
    assert out["seconds"] < 10


def test_the_runs_own_cancellation_still_cancels_through_a_swallowing_tool(
    tmp_path: Path,
) -> None:
    out = tool_run(tmp_path, "swallow", timeout=30, cancel_after=0.5)
    assert out["status"] == out["stored"] == "cancelled", out
    assert out["seconds"] < 10


def test_the_runs_own_cancellation_still_cancels_when_a_tool_answers_it_with_keyboard_interrupt(
    tmp_path: Path,
) -> None:
    """A tool that turns its cancellation into KeyboardInterrupt must not turn a cancelled run
    into one that goes on."""
    code = TOOL_RUN.replace(
        "    while True:",
        "    if KIND == 'convert':\n"
        "        try:\n"
        "            await asyncio.sleep(3600)\n"
        "        except asyncio.CancelledError:\n"
        "            raise KeyboardInterrupt('cancelled? no')\n"
        "    while True:",
    )
    proc = run_python(
        code.format(
            kind="convert",
            effect="read_only",
            timeout=30,
            deadline=None,
            cancel_after=0.5,
            store=str(tmp_path / "runs.sqlite"),
        ),
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["status"] == out["stored"] == "cancelled", out


# -- 4. keel.toml keys that mean nothing -----------------------------------------------------


def test_a_misspelt_keel_toml_key_is_named_with_the_closest_valid_key(keel: Keel) -> None:
    config = keel.config / "keel" / "keel.toml"
    config.write_text('loop_polcy = "adr"\nmodle = "local"\n')
    proc = subprocess.run(
        keel.run_argv(keel.model(1), "--json"),
        capture_output=True,
        text=True,
        env=keel.env(),
        cwd=keel.tmp,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr  # a warning, not an error
    lines = keel_lines(proc.stderr)
    assert len(lines) == 2, proc.stderr
    assert str(config) in lines[0] and "'loop_polcy'" in lines[0] and "'loop_policy'" in lines[0]
    assert "'modle'" in lines[1] and "'model'" in lines[1]
    assert json.loads(proc.stdout)["status"] == "completed"


def test_a_trusted_working_directory_file_is_checked_too(keel: Keel) -> None:
    (keel.tmp / "keel.toml").write_text('model = "local"\nbase_ulr = "http://127.0.0.1:1"\n')
    trusted = subprocess.run(
        [sys.executable, "-m", "keel", "trust"],
        capture_output=True,
        text=True,
        env=keel.env(),
        cwd=keel.tmp,
        timeout=60,
    )
    assert trusted.returncode == 0, trusted.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "keel", "models"],
        capture_output=True,
        text=True,
        env=keel.env(),
        cwd=keel.tmp,
        timeout=60,
    )
    (line,) = keel_lines(proc.stderr)
    assert str(keel.tmp / "keel.toml") in line, line
    assert "'base_ulr'" in line and "'base_url'" in line, line


def test_an_unknown_keel_toml_key_with_no_close_match_lists_the_valid_keys(keel: Keel) -> None:
    config = keel.config / "keel" / "keel.toml"
    config.write_text('durability = "power"\nzzz = 1\n')
    proc = subprocess.run(
        [sys.executable, "-m", "keel", "models"],
        capture_output=True,
        text=True,
        env=keel.env(),
        cwd=keel.tmp,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    (line,) = keel_lines(proc.stderr)
    assert "'zzz'" in line and "loop_policy" in line and "durability" in line, line


def test_known_keys_and_mcp_tables_raise_no_warning(keel: Keel) -> None:
    config = keel.config / "keel" / "keel.toml"
    config.write_text(
        'model = "local"\nbase_url = "http://127.0.0.1:1/v1"\nloop_policy = "adr"\n'
        'durability = "power"\nstore = "/tmp/x.sqlite"\n'
        '[[mcp]]\nname = "glossary"\ncommand = ["python", "glossary.py"]\n'
    )
    proc = subprocess.run(
        [sys.executable, "-m", "keel", "models"],
        capture_output=True,
        text=True,
        env=keel.env(),
        cwd=keel.tmp,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert keel_lines(proc.stderr) == [], proc.stderr
