"""Input from outside that must not crash, hang or drive a run (issue 33, ADR 0049).

`keel replay`'s recordings (lines and gzip members bounded, nesting bounded, wrong types
skipped, time linear in the turns), and the lows: MCP settings and servers nobody here wrote,
an async tool raising GeneratorExit, and the Anthropic stream reader over many deltas. Each
test reproduces what broke first; everything runs for real (the CLI, the run loop, real MCP
servers over stdio, the Anthropic SDK over an httpx transport).
"""

from __future__ import annotations

import asyncio
import gzip
import json
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from contract.harness import Recorder
from keel.cli.app import app
from keel.errors import ConfigError
from keel.messages import ModelRequest, ModelResponse, UserMessage
from keel.records import Event, ModelRequestSent, ToolResultRecorded
from keel.replay.lines import Bounds
from keel.replay.playback import replay
from keel.replay.recordings import Recorded, Recording, Skipped, read_file
from keel.tools.mcp_servers import McpServer, servers_from_config
from keel.tools.mcp_tools import McpToolset
from keel.transports.anthropic import AnthropicTransport
from support import call, run_script

RAW_SERVER = Path(__file__).resolve().parent / "mcp_raw_server.py"


def _run_line(run_id: str, commands: list[str]) -> str:
    turns = [
        [{"tool": "bash", "arguments": {"command": c}, "kind": "read", "result_digest": c}]
        for c in commands
    ]
    return json.dumps({"corpus": "mine", "model": "m", "id": run_id, "turns": turns})


def _replay_cli(path: Path) -> tuple[list[str], str]:
    """The ids `keel replay --json` replayed, and its stderr; it must exit 0 untroubled."""
    out = CliRunner().invoke(app, ["replay", str(path), "--json"])
    assert out.exit_code == 0, (out.exception, out.stderr[-2000:])
    assert "Traceback" not in out.stderr
    return [json.loads(line)["id"] for line in out.stdout.splitlines()], out.stderr


def _nested(levels: int) -> str:
    return "[" * levels + "]" * levels


# -- keel replay ------------------------------------------------------------------------------


def test_replay_skips_a_line_longer_than_its_cap_naming_the_line(tmp_path: Path) -> None:
    """A 65 MiB line (one gzip member's worth of padding) is not read whole: skipped, named."""
    path = tmp_path / "runs.jsonl.gz"
    pad = json.dumps({"id": "huge", "turns": [], "pad": "x" * (65 * 1024 * 1024)})
    with gzip.open(path, "wt", compresslevel=1) as out:
        out.write(_run_line("first", ["ls"]) + "\n" + pad + "\n" + _run_line("last", ["pwd"]))
    ids, err = _replay_cli(path)
    assert ids == ["first", "last"]
    assert f"skipped {path}:2: the line is longer than 64 MiB" in err


def test_replay_reads_a_file_up_to_its_cap_and_says_the_rest_was_not_read(
    tmp_path: Path,
) -> None:
    """A gzip bomb of lines costs a bounded read: past the file cap nothing more is read."""
    path = tmp_path / "bomb.jsonl.gz"
    with gzip.open(path, "wt") as out:
        for n in range(2000):
            out.write(_run_line(f"r{n}", ["ls"]) + "\n")
    skipped: list[Skipped] = []
    size = len(_run_line("r0", ["ls"])) + 1
    found = list(read_file(path, skipped, Bounds(file=10 * size)))
    assert 10 <= len(found) <= 11
    (only,) = skipped
    assert only.where == f"{path}:{len(found) + 1}"
    assert "the rest of it was not read" in only.reason


def test_replay_skips_a_line_nested_too_deep_with_its_number(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    deep_arguments = json.dumps(
        {"id": "deep", "turns": [[{"tool": "t", "arguments": {"a": json.loads(_nested(500))}}]]}
    )
    lines = [_run_line("first", ["ls"]), _nested(100_000), deep_arguments, _run_line("ok", ["a"])]
    path.write_text("\n".join(lines) + "\n")
    ids, err = _replay_cli(path)
    assert ids == ["first", "ok"]
    assert f"skipped {path}:2: nested deeper than 100 levels" in err
    assert f"skipped {path}:3: nested deeper than 100 levels" in err


def test_replay_skips_a_chat_recording_with_wrong_typed_fields_with_its_number(
    tmp_path: Path,
) -> None:
    good = [
        {"role": "user", "content": "Find it."},
        {
            "role": "assistant",
            "tool_calls": [{"id": "c1", "function": {"name": "grep", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "found"},
    ]
    bad = [
        {"messages": [{"role": "assistant", "tool_calls": 5}]},
        {"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "x", "arguments": 7}}]}]},  # noqa: E501
        {"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "x", "arguments": "[" * 5000}}]}]},  # noqa: E501
        {"messages": "text"},
        {"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": ["x"]}}]}]},
    ]
    path = tmp_path / "chats.jsonl"
    items = [{"id": "good", "messages": good}, *bad]
    path.write_text("".join(json.dumps(item) + "\n" for item in items))
    ids, err = _replay_cli(path)
    assert ids == ["good"]
    for number in range(2, 2 + len(bad)):
        assert f"skipped {path}:{number}: " in err, number


def _long_recording(turns: int) -> Recording:
    return Recording(
        id=f"long{turns}",
        turns=tuple(
            (Recorded("bash", {"command": f"ls {n}"}, f"{n:016x}", kind="read"),)
            for n in range(turns)
        ),
    )


async def test_a_replay_asks_its_model_with_requests_that_do_not_grow_with_the_turns() -> None:
    """The playback model reads no history: a request carrying the whole of it, copied anew
    each turn, made a replay quadratic in its turns (300,000 did not finish in 120 s)."""
    sent: list[ModelRequestSent] = []

    def heard(event: Event) -> None:
        if isinstance(event, ModelRequestSent):
            sent.append(event)

    replayed = await replay(_long_recording(3000), listeners=(heard,))
    assert replayed.outcome == "completed" and len(sent) == 2 * 3001
    assert max(e.items for e in sent) == sent[0].items
    assert max(e.estimated_input_tokens for e in sent) == sent[0].estimated_input_tokens


def test_replay_time_grows_in_proportion_to_the_turns() -> None:
    """CPU time (not wall time: the machine is shared) of 8,000 turns against 2,000: 4x when
    linear; the bound leaves room for noise, not for a cost per turn that grows."""

    def cpu(turns: int) -> float:
        recording = _long_recording(turns)
        started = time.process_time()
        asyncio.run(replay(recording))
        return time.process_time() - started

    cpu(200)  # imports and first-call costs out of the way
    short, long = cpu(2000), cpu(8000)
    assert long / short < 6, (short, long)


# -- MCP: settings and servers from outside -----------------------------------------------------


@pytest.mark.parametrize("key", ["connect_timeout", "timeout"])
@pytest.mark.parametrize("value", ["inf", "-inf", "nan"])
def test_an_mcp_table_with_a_timeout_that_is_not_finite_is_a_config_error(
    tmp_path: Path, key: str, value: str
) -> None:
    """`inf` is a TOML float: accepted, it reached `threading` as a timeout and overflowed."""
    path = tmp_path / "keel.toml"
    path.write_text(f'[[mcp]]\ncommand = "python server.py"\n{key} = {value}\n')
    with pytest.raises(ConfigError, match=f"{key} must be a finite, positive number of seconds"):
        servers_from_config(path)


def _raw_server(*mode: str, **options: Any) -> McpServer:
    return McpServer.stdio([sys.executable, str(RAW_SERVER), *mode], **options)


def test_an_mcp_server_whose_tool_schema_nests_3000_deep_is_a_clear_error_at_once(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """The `mcp` client cannot parse the listing (its JSON parser's depth limit): it logged a
    library traceback and Keel waited out `connect_timeout` before saying it had no answer."""
    server = _raw_server("deep-schema", "3000", connect_timeout=20)
    started = time.monotonic()
    with pytest.raises(ConfigError) as info:
        McpToolset([server]).open()
    assert time.monotonic() - started < 10
    message = str(info.value)
    assert "could not list its tools" in message and "could not be read" in message, message
    assert "recursion limit" in message, message
    assert "Traceback" not in capfd.readouterr().err


async def test_a_json_rpc_error_minus_32000_from_an_mcp_server_is_that_calls_error_result() -> None:
    """-32000 is the server's own error range, and also the code the `mcp` client gives a lost
    connection: a live server's -32000 is the call's error result, not a lost connection."""
    async with McpToolset([_raw_server("call-error", "-32000")]) as mcp:
        script = {"turns": [call("probe"), call("echo", text="still here"), {"text": "done"}]}
        outcome = await run_script(script, list(mcp))
    assert outcome.result.status == "completed", outcome.result.failure
    probe, echo = outcome.of_type(ToolResultRecorded)
    assert probe.is_error and "the backend is overloaded; try again later" in probe.content
    assert "lost its connection" not in probe.content
    assert not echo.is_error and echo.content == "still here"


# -- the Anthropic stream reader ---------------------------------------------------------------


def _anthropic_sse(pieces: int, size: int) -> bytes:
    """A Messages stream: one text block and one tool_use block, each in `pieces` deltas."""
    start = {
        "id": "msg_01", "type": "message", "role": "assistant", "model": "claude-sonnet-4-6",
        "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 1},
    }  # fmt: skip
    tool = {"type": "tool_use", "id": "toolu_01", "name": "note", "input": {}}
    events: list[dict[str, Any]] = [
        {"type": "message_start", "message": start},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    ]
    text = "t" * size
    events += [
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}
    ] * pieces
    events += [
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1, "content_block": tool},
        {"type": "content_block_delta", "index": 1,
         "delta": {"type": "input_json_delta", "partial_json": '{"text": "'}},
    ]  # fmt: skip
    events += [
        {"type": "content_block_delta", "index": 1,
         "delta": {"type": "input_json_delta", "partial_json": "j" * size}}
    ] * pieces  # fmt: skip
    events += [
        {"type": "content_block_delta", "index": 1,
         "delta": {"type": "input_json_delta", "partial_json": '"}'}},
        {"type": "content_block_stop", "index": 1},
        {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None},
         "usage": {"output_tokens": pieces}},
        {"type": "message_stop"},
    ]  # fmt: skip
    return "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events).encode()


async def _streamed(pieces: int, size: int) -> tuple[float, ModelResponse]:
    body = _anthropic_sse(pieces, size)
    server = Recorder(
        httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})
    )
    transport = AnthropicTransport("claude-sonnet-4-6", http_client=server.http(), api_key="k")
    heard: list[str] = []
    started = time.process_time()
    response = await transport.request_streaming(
        ModelRequest("sys", (), (UserMessage("q"),)), heard.append
    )
    took = time.process_time() - started
    assert "".join(heard) == response.text
    return took, response


async def test_the_anthropic_stream_reader_joins_many_deltas_in_linear_time() -> None:
    """Text and tool-input deltas are gathered and joined once (a string grown by `+` for
    each delta copies it whole each time). CPU time of 4x the deltas: 4x when linear."""
    await _streamed(200, 400)
    short = min([(await _streamed(5_000, 400))[0] for _ in range(5)])  # the least noisy of 5
    long, response = await _streamed(20_000, 400)
    long = min(long, *[(await _streamed(20_000, 400))[0] for _ in range(4)])
    assert response.text == "t" * 400 * 20_000
    (note,) = response.tool_calls
    assert note.arguments == {"text": "j" * 400 * 20_000}
    assert long / short < 6, (short, long)


def test_replay_reports_at_most_a_thousand_unreadable_lines_of_a_file_then_counts_the_rest(
    tmp_path: Path,
) -> None:
    """A file of unreadable lines (a gzip bomb of them) must not cost a report each in memory."""
    path = tmp_path / "junk.jsonl.gz"
    with gzip.open(path, "wt") as out:
        out.write(_run_line("first", ["ls"]) + "\n" + "{not json\n" * 1500)
    skipped: list[Skipped] = []
    assert [r.id for r in read_file(path, skipped)] == ["first"]
    assert len(skipped) == 1001
    assert skipped[999].where == f"{path}:1001"
    assert skipped[-1] == Skipped(str(path), "500 more lines could not be read (not listed)")
