"""Input from outside that must not hang, drive or double a run, round 3 (issue 46, ADR 0062).

Each test is named after the probe row it answers (EV-01, MC-01, ...) and reproduces what broke
first. Bounds on time are generous (the machine is shared): they tell a run that ends from one
that hangs, never a fast run from a slow one.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import keel
from keel.records import ToolResultRecorded
from keel.transports.local.qwen_format import read_output
from keel.transports.text_calls import read_text_calls
from loopback_http import QuietHandler, serving
from support import call

RAW_SERVER = Path(__file__).resolve().parent / "mcp_raw_server.py"
BACKTRACKING = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a+)+$"}}}
"""Python's `re` takes 2**40 steps to find that "a"*40+"!" does not match it."""


def _took(fn: Any) -> float:
    started = time.monotonic()
    fn()
    return time.monotonic() - started


# -- EV-01: every check over model text is linear ---------------------------------------------


def test_ev01_the_pseudo_call_readers_are_linear_in_the_answer() -> None:
    """A `<tool_call>` block with a long run of white space inside, and 100,000 pseudo-calls
    in a row: each read ends (the lazy regex and the slice per call took minutes)."""
    tools = {"read_file"}
    answers = [
        "<tool_call>x" + " " * 200_000 + "x",
        "functions.read_file:{} " * 100_000,
        '{"name":"read_file","arguments":{}} ' * 100_000,
    ]
    for answer in answers:
        assert _took(lambda a=answer: read_text_calls(a, tools)) < 20, answer[:20]
    qwen = "<tool_call>x" + " " * 200_000 + "x"
    assert _took(lambda: read_output(qwen, "auto", lambda: "local_1")) < 20


def test_ev01_tool_call_blocks_are_cut_as_the_regex_cut_them() -> None:
    found = read_text_calls(
        '<tool_call> {"name": "read_file", "arguments": {"path": "a"}}\n</tool_call>\n'
        '<tool_call>{"name": "read_file", "arguments": {"path": "b"}}',
        {"read_file"},
    )
    assert found is not None and found.problem is None
    assert found.calls == (("read_file", '{"path": "a"}'), ("read_file", '{"path": "b"}'))


# -- MC: MCP tools' input schemas, one bounded path ---------------------------------------------


def _keel_run(tmp_path: Path, schema: dict[str, Any], turns: list[Any], *flags: str) -> Any:
    """`keel run` with the raw MCP server offering `probe` under `schema`, scripted by
    `turns`, `--deadline 10`: the finished process (pytest fails if it is still running at
    60 s) and the store's runs."""
    (tmp_path / "schema.json").write_text(json.dumps(schema))
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": turns}))
    db = tmp_path / "r.db"
    mcp = f"{sys.executable} {RAW_SERVER} schema-file {tmp_path / 'schema.json'}"
    command = [sys.executable, "-m", "keel", "run", "q", "--model", f"script:{script}",
               "--store", str(db), "--repo", str(tmp_path), "--mcp", mcp, "--deadline", "10",
               "--json", *flags]  # fmt: skip
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    except subprocess.TimeoutExpired:
        pytest.fail("keel run did not end within 60 s of a 10 s deadline")
    runs = keel.Store(str(db)).list_runs() if db.exists() else []
    return done, runs


def test_mc01_a_backtracking_pattern_in_an_mcp_input_schema_ends_quickly(
    tmp_path: Path,
) -> None:
    """MC-01: `^(a+)+$` against "a"*40+"!" ran 10 minutes past `--deadline 10`; now the
    pattern is matched by RE2 and the call is answered with the mismatch."""
    turns = [call("probe", s="a" * 40 + "!"), {"text": "done"}]
    done, runs = _keel_run(tmp_path, BACKTRACKING, turns)
    assert done.returncode == 0, done.stderr[-2000:]
    (run,) = runs
    assert run.status == "completed"
    (result,) = [
        e for e in keel.Store(str(tmp_path / "r.db")).events(run.run_id)
        if isinstance(e, ToolResultRecorded)
    ]  # fmt: skip
    assert result.is_error and "does not match" in result.content


@pytest.mark.parametrize("ref", ["file:///etc/hostname", "other.json#/x"])
def test_mc03_a_ref_to_a_file_is_refused_at_registration_and_not_read(
    tmp_path: Path, ref: str
) -> None:
    """MC-03: a `$ref` to `file:///etc/hostname` was read when the tool was called, then the
    run crashed with a traceback, left `running`. Now the tool is refused when the server's
    tools are listed, naming the $ref; no run starts, nothing is read."""
    schema = {"type": "object", "properties": {"s": {"$ref": ref}}}
    done, runs = _keel_run(tmp_path, schema, [call("probe", s=5), {"text": "done"}])
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "$ref" in done.stderr and ref in done.stderr and "probe" in done.stderr
    assert not [r for r in runs if r.status == "running"]


def test_mc04_a_ref_to_a_loopback_url_is_never_fetched(tmp_path: Path) -> None:
    """MC-04: a `$ref` to `http://127.0.0.1:PORT/...` was fetched by Keel's process when the
    model called the tool, outside the `--allow-host` guard. The server counts requests: 0."""
    seen: list[str] = []

    class Counting(QuietHandler):
        def do_GET(self) -> None:
            seen.append(self.path)
            self.reply(b'{"type": "string"}')

    with serving(ThreadingHTTPServer(("127.0.0.1", 0), Counting)) as server:
        ref = f"http://127.0.0.1:{server.server_address[1]}/s.json"
        schema = {"type": "object", "properties": {"s": {"$ref": ref}}}
        done, runs = _keel_run(tmp_path, schema, [call("probe", s=5), {"text": "done"}])
    assert seen == []
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "never fetches" in done.stderr
    assert not [r for r in runs if r.status == "running"]


FORKING = {"$defs": {"n": {"anyOf": [{"type": "array", "items": {"$ref": "#/$defs/n"}},
                                     {"type": "array", "items": {"$ref": "#/$defs/n"}}]}},
           "type": "object", "properties": {"a": {"$ref": "#/$defs/n"}}}  # fmt: skip
"""Two branches per level: arguments that fail at their bottom are tried 2**depth ways."""


async def test_mc01_mcp_arguments_are_checked_off_the_loop_and_cut_off_in_time() -> None:
    """The executor checks an MCP tool's arguments in a thread of their own: the event loop
    keeps its turns, and a check whose branches multiply is cut off (an argument error)."""
    import asyncio

    from mcp.types import Tool as RemoteTool

    from keel.tools.base import ToolArgumentError
    from keel.tools.mcp_servers import McpServer
    from keel.tools.mcp_tools import _keel_tool

    server = McpServer.stdio(["unused"], name="raw")
    remote = RemoteTool(name="probe", inputSchema=FORKING)
    tool = _keel_tool(server, remote, None)
    arguments = {"a": json.loads("[" * 40 + '"x"' + "]" * 40)}
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.02)
            ticks += 1

    ticker = asyncio.create_task(tick())
    started = time.monotonic()
    with pytest.raises(ToolArgumentError, match="took"):
        await tool.checked(arguments)
    took = time.monotonic() - started
    ticker.cancel()
    assert took < 30 and ticks >= 10  # the loop went on while the check ran


# -- MC-02: edited arguments, the same bounded path, off the loop -------------------------------

_EDITED = """
import asyncio, json, time, keel, pydantic
from keel.serve.runs import Decision, RunService
from keel.tools.base import Effect, Tool
from keel.transports.scripted import ScriptedTransport

class Anything(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="allow")

async def probe(arguments: Anything) -> str:
    return "probed"

tool = Tool(name="probe", description="Probe.", args_model=Anything, fn=probe, pass_model=True,
            effect=Effect.SIDE_EFFECTING, requires_approval=True, parameters=SCHEMA)
turns = [{"tool_calls": [{"name": "probe", "arguments": {"s": "aaa"}}]}, {"text": "done"}]
agent = keel.Agent(ScriptedTransport.from_dict({"turns": turns * 2}), tools=[tool],
                   store=keel.Store(":memory:"))
HOSTILE = {"s": "a" * 40 + "!"}

async def main():
    first = await agent.arun("q")
    call = first.pending_approvals[0].call_id
    try:
        agent.approve(first.run_id, call, arguments=HOSTILE)
    except keel.ConfigError as refused:
        print(json.dumps({"library": str(refused)}))
    ticks = 0
    async def tick():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1
    ticker = asyncio.create_task(tick())
    service = RunService(agent, ":memory:")
    try:
        await service.decide(first.run_id, [Decision(call, True, arguments=HOSTILE)])
    except keel.ConfigError as refused:
        print(json.dumps({"served": str(refused), "ticks": ticks}))
    ticker.cancel()

asyncio.run(main())
"""


def test_mc02_edited_arguments_are_checked_by_the_bounded_path_off_the_loop() -> None:
    """MC-02: edited arguments against `^(a+)+$` were validated with plain jsonschema on the
    event loop: one A2A decision hung `keel serve` (for 29 minutes, past SIGTERM). Now the
    library and the server refuse them at once, nothing recorded, the loop ticking."""
    from isolated import run_python

    done = run_python(f"SCHEMA = {BACKTRACKING!r}\n" + _EDITED, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    library, served = (json.loads(line) for line in done.stdout.splitlines())
    assert "does not match" in library["library"] and "nothing was recorded" in library["library"]
    assert "does not match" in served["served"]


# -- DC-10: a server continues a run only under the policy it was started with -------------------


async def test_dc10_a_server_that_pre_approves_more_does_not_continue_the_run(
    tmp_path: Path,
) -> None:
    """DC-10: `keel serve --allow-writes --approve-tools write_file` continued a run started
    without pre-approval: after one write approved over A2A, the next ran unasked. Now the
    decision is refused before anything is recorded, naming the difference."""
    from a2a.utils.errors import InvalidParamsError

    from a2a_serving import WRITE, a2a, collect, decisions, paused, runs_in
    from test_serve_hostile import serving

    script = tmp_path / "write.json"
    script.write_text(json.dumps(WRITE))
    store, repo = tmp_path / "runs.db", tmp_path / "repo"
    with serving(script, repo, store, "--allow-writes") as (url, _):
        async with a2a(url) as client:
            task_id, pending = await paused(client)
    with serving(script, repo, store, "--allow-writes", "--approve-tools", "write_file") as (
        url,
        _,
    ):
        async with a2a(url) as client:
            approve = decisions(task_id, {"call_id": pending["call_id"], "approve": True})
            with pytest.raises(InvalidParamsError, match="pre-approves write_file"):
                await collect(client.send_message(approve))
    assert not (repo / "out.txt").exists()
    [run] = runs_in(store)
    assert run.status == "awaiting_approval" and run.state.decisions == {}


def test_dc10_allowed_hosts_and_writes_are_compared_too() -> None:
    """The policy compared: tools pre-approved, hosts let through, writes offered. A server
    that allows less than the run did may go on (it asks more); one that allows more may not."""
    from keel.records import RunConfig, RunState
    from keel.serve.runs import mismatch
    from keel.store import RunRecord

    def served(**settings: Any) -> keel.Agent:
        base = {"repo": "/r", "allow_hosts": [], "allow_writes": False}
        transport = keel.ScriptedTransport.from_dict({"turns": [{"text": "x"}]})
        return keel.Agent(transport, run_config={**base, **settings.pop("settings", {})},
                          store=keel.Store(":memory:"), **settings)  # fmt: skip

    started = served(settings={"allow_hosts": ["127.0.0.1"], "allow_writes": True})
    config = started.config()
    record = RunRecord("run_x", 0.0, 0.0, "q", config.model, "awaiting_approval", config,
                       RunState())  # fmt: skip
    hosts = served(settings={"allow_hosts": ["127.0.0.1", "169.254.169.254"]})
    assert mismatch(hosts, record) == (
        "this server lets fetch reach 169.254.169.254, which the run did not allow (--allow-host)"
    )
    strict = record.config.settings | {"allow_writes": False}
    writes = RunRecord("run_y", 0.0, 0.0, "q", config.model, "awaiting_approval",
                       RunConfig(config.model, config.system_prompt, settings=strict),
                       RunState())  # fmt: skip
    assert "offers write_file" in str(mismatch(started, writes))
    assert mismatch(served(), record) is None  # allows less: it asks more, never less


# -- DC-05: a decision that arrives after the expiry still lets the run go on --------------------


def _expiring_agent() -> keel.Agent:
    @keel.tool(effect="side_effecting", requires_approval=True)
    def publish(text: str) -> str:
        """Publish text."""
        return f"published {text}"

    turns = [call("publish", text="x"), {"text": "not published"}]
    return keel.Agent(
        keel.ScriptedTransport.from_dict({"turns": turns}),
        tools=[publish],
        store=keel.Store(":memory:"),
        limits=keel.Limits(approval_timeout=0.2),
    )


async def _ended(agent: keel.Agent, run_id: str) -> str:
    """The run's status once it has stopped advancing (the test fails if it has not in 30 s)."""
    import asyncio

    for _ in range(300):
        record = agent.store.get_run(run_id)
        assert record is not None
        if record.status not in ("running", "awaiting_approval"):
            return record.status
        await asyncio.sleep(0.1)
    pytest.fail(f"run {run_id} was left {record.status}")


async def test_dc05_an_a2a_decision_after_the_expiry_is_refused_and_the_run_goes_on() -> None:
    """DC-05: the expiry's denial was recorded but the run never resumed: the task stayed
    `working`. Now the late decider is told (DecisionExpired) and the run goes on denied."""
    import asyncio

    from keel.errors import DecisionExpired
    from keel.serve.runs import Decision, RunService

    agent = _expiring_agent()
    paused = await agent.arun("q")
    (pending,) = paused.pending_approvals
    await asyncio.sleep(0.4)
    service = RunService(agent, ":memory:")
    with pytest.raises(DecisionExpired):
        await service.decide(paused.run_id, [Decision(pending.call_id, True)])
    assert await _ended(agent, paused.run_id) == "completed"


async def test_dc05_an_ag_ui_decision_after_the_expiry_is_refused_and_the_run_goes_on() -> None:
    import asyncio

    import httpx
    from starlette.applications import Starlette

    from keel.serve.ag_ui import ag_ui_routes

    agent = _expiring_agent()
    paused = await agent.arun("q")
    (pending,) = paused.pending_approvals
    await asyncio.sleep(0.4)
    entry = {"interruptId": f"{paused.run_id}:{pending.call_id}", "status": "resolved",
             "payload": {"approved": True}}  # fmt: skip
    body = {"threadId": "t", "runId": "r2", "messages": [], "resume": [entry]}
    app = Starlette(routes=ag_ui_routes(agent))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
        refused = await http.post("/ag-ui", json=body)
    assert refused.status_code == 409 and "expired" in refused.text.lower(), refused.text
    assert await _ended(agent, paused.run_id) == "completed"


# -- DC-03, UI-03: edited arguments nested too deep are refused, never a traceback --------------


def test_dc03_keel_approve_arguments_nested_5000_deep_is_a_usage_error(tmp_path: Path) -> None:
    """DC-03: `keel approve --arguments` nested 5,000 deep gave a RecursionError traceback."""
    from typer.testing import CliRunner

    from keel.cli.app import app

    deep = '{"a": ' + "[" * 5000 + "]" * 5000 + "}"
    out = CliRunner().invoke(
        app, ["approve", "run_x", "k1_0", "--arguments", deep, "--store", str(tmp_path / "r.db")]
    )
    assert out.exit_code == 2, (out.exception, out.output[-2000:])
    assert "nested too deep" in out.output and "Traceback" not in out.output


def test_dc03_edited_arguments_nested_past_64_levels_are_refused_before_recording() -> None:
    agent = _expiring_agent()
    paused = agent.run("q")
    (pending,) = paused.pending_approvals
    deep = json.loads('{"text": ' + "[" * 100 + "]" * 100 + "}")
    with pytest.raises(keel.ConfigError, match="nested more than 64 levels"):
        agent.approve(paused.run_id, pending.call_id, arguments=deep)
    assert agent.store.get_run(paused.run_id).state.decisions == {}  # type: ignore[union-attr]


def test_ui03_the_approve_forms_arguments_nested_1500_deep_are_refused_not_a_500() -> None:
    """UI-03: `keel ui`'s approve form with arguments nested 1,500 deep was a 500."""
    from keel.ui.actions import edited_arguments

    with pytest.raises(ValueError, match="nested too deep"):
        edited_arguments('{"a": ' + "[" * 1500 + "]" * 1500 + "}")


# -- MC-07: a value set over one of Keel's own variables is never replaced by Keel's own ---------


def test_mc07_a_resume_never_passes_keels_own_variable_for_a_value_the_user_set(
    tmp_path: Path,
) -> None:
    """MC-07: `keel run --mcp-env OPENAI_API_KEY=dummy`: on `keel resume` the MCP server got the
    real OPENAI_API_KEY from Keel's environment. Now the resume is refused, naming how to give
    the value again, and `keel resume --mcp-env` gives it."""
    import os

    real = "sk-real-" + "x" * 24
    env = {**os.environ, "OPENAI_API_KEY": real}
    (tmp_path / "notes.md").write_text("notes\n")
    write = call("write_file", path="out.txt", content="x\n")
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": [write, call("probe"), {"text": "done"}]}))
    db = tmp_path / "r.db"
    mcp = f"{sys.executable} {RAW_SERVER} env-echo OPENAI_API_KEY"

    def keel_cli(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "keel", *args, "--store", str(db)]
        return subprocess.run(command, capture_output=True, text=True, timeout=120, env=env,
                              cwd=tmp_path)  # fmt: skip

    started = keel_cli("run", "q", "--model", f"script:{script}", "--repo", str(tmp_path),
                       "--allow-writes", "--mcp", mcp, "--mcp-env", "OPENAI_API_KEY=dummy",
                       "--json")  # fmt: skip
    run_id = json.loads(started.stdout)["run_id"]
    assert json.loads(started.stdout)["status"] == "awaiting_approval", started.stderr
    assert keel_cli("approve", run_id, "--all").returncode == 0
    refused = keel_cli("resume", run_id, "--json")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert "--mcp-env OPENAI_API_KEY=VALUE" in refused.stderr
    resumed = keel_cli("resume", run_id, "--mcp-env", "OPENAI_API_KEY=dummy", "--json")
    assert json.loads(resumed.stdout)["status"] == "completed", resumed.stderr
    results = [
        e.content for e in keel.Store(str(db)).events(run_id) if isinstance(e, ToolResultRecorded)
    ]
    assert any("dummy" in r for r in results) and not any(real in r for r in results)
    assert real.encode() not in db.read_bytes()


# -- C08b: an MCP timeout too large to wait for is refused at start ----------------------------


@pytest.mark.parametrize("key", ["timeout", "connect_timeout"])
def test_c08b_an_mcp_timeout_of_1e12_is_refused_at_start_not_a_traceback(key: str) -> None:
    """C08b: `[[mcp]] connect_timeout = 1e12` (finite) was a traceback: no thread waits that
    long. Now a timeout past a day is refused, naming it."""
    from keel.tools.mcp_servers import McpServer

    table = {"name": "big", "command": [sys.executable, str(RAW_SERVER), "call-error", "1"],
             key: 1e12}  # fmt: skip
    with pytest.raises(keel.ConfigError, match=f"{key} must be"):
        McpServer.from_json(table, "[[mcp]] #1")


# -- RP-01: a recording's lines are capped in values, not only in characters --------------------


def test_rp01_a_line_of_millions_of_empty_values_is_skipped_not_parsed(tmp_path: Path) -> None:
    """RP-01: a 184 KB gzip recording of millions of empty values drove `keel replay` to
    6.5 GB: the caps counted characters, and `{}` is two. A line holding more values than
    MAX_VALUES is now skipped before it is parsed, naming it; the lines around it are read."""
    import gzip

    from typer.testing import CliRunner

    from keel.cli.app import app
    from keel.replay.lines import MAX_VALUES

    def run_line(run_id: str) -> str:
        turn = [{"tool": "bash", "arguments": {"command": "ls"}, "kind": "read",
                 "result_digest": "ls"}]  # fmt: skip
        return json.dumps({"corpus": "mine", "model": "m", "id": run_id, "turns": [turn]})

    path = tmp_path / "bomb.jsonl.gz"
    empties = '{"id": "bomb", "turns": [' + "{}," * (MAX_VALUES + 1) + "{}]}"
    with gzip.open(path, "wt", compresslevel=9) as out:
        out.write(run_line("first") + "\n" + empties + "\n" + run_line("last") + "\n")
    assert path.stat().st_size < 1024 * 1024
    out = CliRunner().invoke(app, ["replay", str(path), "--json"])
    assert out.exit_code == 0 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert [json.loads(line)["id"] for line in out.stdout.splitlines()] == ["first", "last"]
    assert f"skipped {path}:2: it holds more than {MAX_VALUES:,} JSON values" in out.stderr


# -- SO-01: draft-03's in-place keywords are walked by the cycle check ---------------------------

DRAFT3 = "http://json-schema.org/draft-03/schema#"


@pytest.mark.parametrize(
    "schema",
    [
        {"$schema": DRAFT3, "extends": {"$ref": "#"}},
        {"$schema": DRAFT3, "extends": [{"type": "object"}, {"$ref": "#"}]},
        {"$schema": DRAFT3, "type": ["null", {"$ref": "#"}]},
        {"$schema": DRAFT3, "disallow": [{"$ref": "#"}]},
    ],
)
def test_so01_a_draft_03_cycle_is_refused_at_start(schema: dict[str, Any]) -> None:
    """SO-01: draft-03 cycles (`extends`, `type: [schema]`, `disallow`) passed the cycle
    check, and validating any value against them never ended but in a RecursionError."""
    from keel.structured import OutputSpec

    with pytest.raises(keel.ConfigError, match=r"\$ref cycle"):
        OutputSpec.of(schema)


# -- ST-01: the chat stream reader is linear in the deltas ---------------------------------------


@pytest.mark.parametrize("field", ["reasoning_content", "refusal", "arguments"])
async def test_st01_the_chat_stream_reader_joins_deltas_once(field: str) -> None:
    """ST-01: `reasoning_content` and `refusal` deltas (and a call's arguments) were joined by
    `+` per delta, each copying the whole so far: quadratic in a long stream."""
    from keel.transports.sse_readers import read_chat

    piece, count = "y" * 20, 300_000

    def delta() -> dict[str, Any]:
        if field == "arguments":
            return {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}
        return {field: piece}

    async def events() -> Any:
        for _ in range(count):
            yield {"id": "c", "choices": [{"index": 0, "delta": delta()}]}
        yield {"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}

    started = time.monotonic()
    read = await read_chat(events(), lambda text: None, "chat")
    assert time.monotonic() - started < 60
    assert read is not None
    message = read["choices"][0]["message"]
    got = (
        message["tool_calls"][0]["function"]["arguments"]
        if field == "arguments"
        else message[field]
    )
    assert len(got) == len(piece) * count


# -- N-SV09: a JSON-RPC body nested 200,000 deep is refused at the door --------------------------


async def test_nsv09_a_json_rpc_body_nested_200000_deep_is_refused_without_a_traceback(
    tmp_path: Path,
) -> None:
    """N-SV09: such a body was -32603 (internal error) with a RecursionError traceback in the
    server's log. Now the door refuses it, -32600 naming the nesting, before the SDK reads it."""
    import httpx

    from a2a_serving import ANSWER
    from test_serve_hostile import serving

    script = tmp_path / "answer.json"
    script.write_text(json.dumps(ANSWER))
    deep = "[" * 200_000 + "]" * 200_000
    body = '{"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": ' + deep + "}"
    headers = {"content-type": "application/json", "A2A-Version": "1.0"}
    with serving(script, tmp_path / "repo", tmp_path / "runs.db") as (url, process):
        async with httpx.AsyncClient(timeout=30) as http:
            answer = await http.post(url + "/a2a/jsonrpc", content=body, headers=headers)
        process.terminate()
        _, logged = process.communicate(timeout=30)
    error = answer.json()["error"]
    assert error["code"] == -32600 and "nested" in error["message"], error
    assert "Traceback" not in logged, logged[-3000:]


# -- DC-09: a message that says two things decides nothing --------------------------------------


async def test_dc09_a_reply_whose_text_denies_and_whose_data_approves_is_refused(
    tmp_path: Path,
) -> None:
    """DC-09: a message whose text said "deny" and whose data part approved was taken as an
    approval. A conflict is refused, nothing recorded; the same words agreeing are taken."""
    import uuid

    from a2a.helpers import new_data_part
    from a2a.types import Message, Part, Role, SendMessageRequest
    from a2a.utils.errors import InvalidParamsError

    from a2a_serving import WRITE, a2a, collect, keel_serve, paused, runs_in

    def reply(task_id: str, text: str, approve: bool, call_id: str) -> SendMessageRequest:
        data = {"keel_decisions": [{"call_id": call_id, "approve": approve}]}
        parts = [Part(text=text), new_data_part(data)]
        message = Message(message_id=uuid.uuid4().hex, role=Role.ROLE_USER, task_id=task_id,
                          parts=parts)  # fmt: skip
        return SendMessageRequest(message=message)

    with keel_serve(tmp_path, WRITE, "--allow-writes") as (url, _):
        async with a2a(url) as client:
            task_id, pending = await paused(client)
            with pytest.raises(InvalidParamsError, match="says two things"):
                await collect(client.send_message(reply(task_id, "deny", True, pending["call_id"])))
            [run] = [r for r in runs_in(tmp_path / "runs.db") if r.run_id == task_id]
            assert run.state.decisions == {}
            await collect(client.send_message(reply(task_id, "yes", True, pending["call_id"])))
    [run] = [r for r in runs_in(tmp_path / "runs.db") if r.run_id == task_id]
    assert run.state.decisions[pending["call_id"]].approved


# -- N-RP01, RP-04: a first line that starts with "[" is one line of a JSON-lines file -----------


def _trajectory(run_id: str) -> str:
    turn = [{"tool": "bash", "arguments": {"command": "ls"}, "kind": "read", "result_digest": "l"}]
    return json.dumps({"corpus": "mine", "model": "m", "id": run_id, "turns": [turn]})


def test_nrp01_a_too_deep_first_line_does_not_lose_the_good_line_after_it(
    tmp_path: Path,
) -> None:
    """N-RP01: a first line too deep to parse that starts with `[` was taken for a whole-file
    document: the good second line was lost with it."""
    from keel.replay.recordings import Skipped, read_file

    path = tmp_path / "runs.jsonl"
    path.write_text("[" * 200_000 + "]" * 200_000 + "\n" + _trajectory("good") + "\n")
    skipped: list[Skipped] = []
    assert [r.id for r in read_file(path, skipped)] == ["good"]
    assert [s.where for s in skipped] == [f"{path}:1"]


def test_rp04_a_json_lines_file_of_bare_message_lists_is_read_line_by_line(
    tmp_path: Path,
) -> None:
    """RP-04: each line a bare message list (as the reader's docstring allows) was read as one
    document, and failed as one."""
    from keel.replay.recordings import Skipped, read_file

    def messages(command: str) -> str:
        return json.dumps([
            {"role": "user", "content": "Find it."},
            {"role": "assistant", "tool_calls": [
                {"id": "c1", "function": {"name": "bash", "arguments": json.dumps({"c": command})}}
            ]},
            {"role": "tool", "tool_call_id": "c1", "content": "found"},
        ])  # fmt: skip

    path = tmp_path / "chats.jsonl"
    path.write_text(messages("ls") + "\n" + messages("pwd") + "\n")
    skipped: list[Skipped] = []
    recordings = list(read_file(path, skipped))
    assert len(recordings) == 2 and skipped == [], skipped
    assert [r.turns[0][0].arguments for r in recordings] == [{"c": "ls"}, {"c": "pwd"}]


# -- TR-02: keel trust says what it grants, and grants each risky key only when asked -----------


def test_tr02_keel_trust_names_what_it_grants_and_each_risky_key_needs_its_own_grant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TR-02: `keel trust` said it let `keel run` use a folder's model and base_url, printed
    `trusted PATH`, and granted everything else too: sending the real key to the base_url
    (api_key_env), pre-approving writes (allow_writes, approve_tools), opening loopback and
    cloud-metadata hosts (allow_hosts). Now it lists each key with what it grants; the risky
    ones are used only when granted by name (`--grant KEY`), and say so when they are not."""
    from typer.testing import CliRunner

    from keel.cli.app import app
    from keel.config import config_files

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "keel.toml").write_text(
        'model = "openai-chat:m"\nbase_url = "http://127.0.0.1:9/v1"\n'
        'api_key_env = "OPENAI_API_KEY"\nallow_writes = true\napprove_tools = ["write_file"]\n'
        'allow_hosts = ["169.254.169.254"]\n'
    )
    out = CliRunner().invoke(app, ["trust", str(repo)])
    assert out.exit_code == 0, out.output
    for key in ("model", "base_url", "api_key_env", "allow_writes", "approve_tools", "allow_hosts"):
        assert key in out.output
    assert "not granted" in out.output and "--grant api_key_env" in out.output
    (used,), warnings = config_files(repo)
    assert set(used.data) == {"model", "base_url"}
    assert any("api_key_env" in w and "--grant" in w for w in warnings)

    out = CliRunner().invoke(app, ["trust", str(repo), "--grant", "allow_writes"])
    assert out.exit_code == 0, out.output
    (used,), _ = config_files(repo)
    assert set(used.data) == {"model", "base_url", "allow_writes"}
    refused = CliRunner().invoke(app, ["trust", str(repo), "--grant", "colour"])
    assert refused.exit_code == 2 and "colour" in refused.output
