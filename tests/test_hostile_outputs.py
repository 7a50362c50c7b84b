"""What comes from outside a run cannot crash it, hang it or leak through it (issue 33).

The caller's output schema, the model's answer to it, the live answer file's folder, a price
table and the API key a run was given each get a case here: every one ends in a refusal at
start, a classified failure or a bounded cost, never a traceback, a hang or a run left
`running` (ADR 0048).
"""

from __future__ import annotations

import json
import math
import os
import signal
import stat
import subprocess
import sys
import time
import tomllib
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pydantic
import pytest
from typer.testing import CliRunner

import keel
from contract import case_anthropic, case_openai_chat, case_openai_responses
from contract.harness import Recorder
from isolated import run_python
from keel.cli.app import app
from keel.live_file import LiveFiles, live_dir, live_path
from keel.pricing import Price, PriceTable, configured_prices
from keel.records import OutputRejected
from keel.structured import OutputSpec
from keel.transports.anthropic import AnthropicTransport
from keel.transports.openai_chat import OpenAIChatTransport
from keel.transports.openai_responses import OpenAIResponsesTransport
from keel.transports.scripted import ScriptedTransport
from keel.transports.streaming import TextDelta
from keel.ui.live_text import LiveTexts, read
from loopback_http import QuietHandler, serving
from support import call

# --- prices ----------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_price_that_is_not_a_finite_number_is_refused(bad: float) -> None:
    with pytest.raises(keel.ConfigError, match="finite"):
        Price(bad, 0.0, 0.0)
    with pytest.raises(keel.ConfigError, match=r"openai\.house"):
        PriceTable.from_toml({"openai": {"house": {"input": 1.0, "cached_input": bad,
                                                   "output": 1.0}}}, "mine")  # fmt: skip


@pytest.mark.parametrize("word", ["nan", "inf", "+inf", "-nan"])
def test_a_keel_toml_price_of_nan_or_inf_is_refused_at_start(tmp_path: Path, word: str) -> None:
    toml = tmp_path / "keel.toml"
    toml.write_text(f'[prices.openai]\n"gpt-4o" = {{ input = 1.0, cached_input = 0.1, '
                    f"output = {word} }}\n")  # fmt: skip
    with pytest.raises(keel.ConfigError, match=r"gpt-4o.*finite"):
        configured_prices([(toml, tomllib.loads(toml.read_text()))])


# --- the output schema, checked at start -----------------------------------------------------

RECURSIVE = {"type": "array", "items": {"$ref": "#"}}
"""A legitimate recursive schema: a list of lists, each level one level deeper in the answer."""
FORKING = {"$defs": {"n": {"anyOf": [{"type": "array", "items": {"$ref": "#/$defs/n"}},
                                     {"type": "array", "items": {"$ref": "#/$defs/n"}}]}},
           "$ref": "#/$defs/n"}  # fmt: skip
"""Two branches per level: an answer that fails at its bottom is tried 2**depth ways."""


def nested(depth: int, leaf: str = "[]") -> str:
    return "[" * depth + leaf + "]" * depth


@keel.tool
def fetch(url: str) -> str:
    """Download a web page as text."""
    return f"page {url}"


class Finding(pydantic.BaseModel):
    module: str
    confident: bool


FINDING = {"module": "loop", "confident": True}


def scripted(script: dict[str, Any], output: Any, **limits: Any) -> keel.Agent:
    transport = ScriptedTransport.from_dict(script, record=True)
    return keel.Agent(transport, tools=[fetch], store=keel.Store(":memory:"),
                      limits=keel.Limits(**limits), output_type=output)  # fmt: skip


@pytest.mark.parametrize(
    "schema",
    [
        {"$ref": "#"},
        {"allOf": [{"$ref": "#"}]},
        {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"anyOf": [{"type": "null"},
                                                                {"$ref": "#/$defs/a"}]}},
         "$ref": "#/$defs/a"},
    ],
)
def test_a_ref_cycle_that_never_reaches_a_value_is_refused_at_start(schema: Any) -> None:
    with pytest.raises(keel.ConfigError, match=r"\$ref cycle"):
        OutputSpec.of(schema)


@pytest.mark.parametrize(
    "ref",
    ["https://example.com/schema.json", "file:///etc/passwd", "other.json#/x", "//host/s",
     "#/$defs/missing"],
)
def test_a_ref_that_is_not_inside_the_schema_is_refused_without_retrieval(ref: str) -> None:
    schema = {"type": "object", "properties": {"a": {"$ref": ref}}, "$defs": {}}
    with pytest.raises(keel.ConfigError, match=r"\$ref") as refused:
        OutputSpec.of(schema)
    assert ref in str(refused.value)


@pytest.mark.parametrize("pattern", [r"(a)\1", r"^(?=x)", r"(?<!a)b"])
def test_a_pattern_re2_cannot_take_is_refused_at_start_naming_it(pattern: str) -> None:
    for schema in (
        {"type": "string", "pattern": pattern},
        {"type": "object", "patternProperties": {pattern: {"type": "string"}}},
    ):
        with pytest.raises(keel.ConfigError, match="RE2") as refused:
            OutputSpec.of(schema)
        assert repr(pattern) in str(refused.value)


def test_a_property_named_pattern_is_a_name_not_a_regular_expression() -> None:
    schema = {"type": "object", "properties": {"pattern": {"type": "string"}}}
    assert OutputSpec.of(schema).schema == schema


def test_a_schema_nested_thousands_deep_is_refused_at_start_not_a_traceback() -> None:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(3000):
        schema = {"type": "array", "items": schema}
    with pytest.raises(keel.ConfigError, match="nested"):
        OutputSpec.of(schema)


# --- the answer, validated bounded and off the event loop ------------------------------------


async def test_a_recursive_schema_validates_a_modest_answer_and_refuses_one_300_deep() -> None:
    ok = await scripted({"turns": [{"text": nested(20)}]}, RECURSIVE).arun("q")
    assert ok.status == "completed" and ok.output == json.loads(nested(20))
    agent = scripted({"turns": [{"text": nested(300)}] * 3}, RECURSIVE)
    result = await agent.arun("q")
    assert result.status == "failed" and result.failure is not None
    assert result.failure.kind == "InvalidOutput" and "nested" in result.failure.message
    stored = agent.store.get_run(result.run_id)
    assert stored is not None and stored.status == "failed"


_WATCHED_RUN = """
import asyncio, json, time, keel
from keel.transports.scripted import ScriptedTransport

async def main():
    transport = ScriptedTransport.from_dict({"turns": [{"text": %(answer)r}] * 3})
    agent = keel.Agent(transport, store=keel.Store(":memory:"), output_type=%(schema)r,
                       limits=keel.Limits(%(limits)s))
    ticks = 0
    async def tick():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.02)
            ticks += 1
    ticker = asyncio.create_task(tick())
    started = time.monotonic()
    result = await agent.arun("q")
    took = time.monotonic() - started
    ticker.cancel()
    print(json.dumps({"status": result.status, "took": took, "ticks": ticks,
                      "kind": result.failure.kind if result.failure else None,
                      "message": result.failure.message if result.failure else None}))

asyncio.run(main())
"""


def watched_run(schema: Any, answer: str, limits: str, timeout: float) -> dict[str, Any]:
    """A run in its own interpreter (a blocked loop would hang this one), with a task that
    ticks every 20 ms beside it: what it ended as, how long it took, how often the loop ticked."""
    done = run_python(_WATCHED_RUN % {"schema": schema, "answer": answer, "limits": limits},
                      timeout)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def test_a_backtracking_pattern_against_a_crafted_answer_does_not_block_the_loop() -> None:
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a+)+$"}},
              "patternProperties": {"^(b+)+$": {"type": "string"}},
              "additionalProperties": False}  # fmt: skip
    answer = json.dumps({"s": "a" * 40 + "!", "b" * 40 + "!": "x"})
    seen = watched_run(schema, answer, "", timeout=30)
    assert seen["status"] == "failed" and seen["kind"] == "InvalidOutput"
    assert "does not match" in seen["message"] and "not allowed" in seen["message"]
    assert seen["took"] < 10


async def test_a_valid_answer_that_is_a_json_string_is_the_output() -> None:
    schema = {"type": "string", "pattern": "^a+$"}
    result = await scripted({"turns": [{"text": '"aaa"'}]}, schema).arun("q")
    assert result.status == "completed", result.failure
    assert result.output == "aaa" and result.model_calls == 1


def test_a_costly_validation_is_cut_off_and_the_deadline_still_ends_the_run() -> None:
    seen = watched_run(FORKING, nested(40, '"x"'), "deadline=3", timeout=40)
    assert seen["status"] == "failed" and seen["kind"] == "DeadlineExceeded"
    assert seen["took"] < 6
    assert seen["ticks"] >= seen["took"] / 0.02 / 4  # the loop kept its turns all along


def test_sigterm_ends_a_run_whose_answer_is_being_validated(tmp_path: Path) -> None:
    schema, script = tmp_path / "schema.json", tmp_path / "script.json"
    schema.write_text(json.dumps(FORKING))
    script.write_text(json.dumps({"turns": [{"text": nested(40, '"x"')}] * 3}))
    db = tmp_path / "r.db"
    command = [sys.executable, "-m", "keel", "run", "q", "--model", f"script:{script}",
               "--store", str(db), "--output-schema", str(schema), "--json"]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env=os.environ | {"PYTHONUNBUFFERED": "1"})  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not _has_run(db):
            time.sleep(0.1)
        time.sleep(1.0)  # the first answer is being validated now
        process.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        process.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        pytest.fail("keel run did not end within 15 s of SIGTERM")
    assert time.monotonic() - sent < 5
    assert process.returncode != 0
    (run,) = keel.Store(str(db)).list_runs()
    assert run.status == "cancelled"


def _has_run(db: Path) -> bool:
    if not db.exists():
        return False
    try:
        return bool(keel.Store(str(db)).list_runs())
    except keel.KeelError:
        return False


# --- the synthesis turn ----------------------------------------------------------------------


async def test_a_synthesis_answer_without_the_envelope_that_matches_the_schema_is_the_partial_output() -> None:  # noqa: E501
    script = {"turns": [call("fetch", url="a")], "on_synthesis": {"text": json.dumps(FINDING)}}
    result = await scripted(script, Finding, max_model_calls=2).arun("q")
    assert result.status == "completed", result.failure
    assert result.partial and result.gaps == () and result.output == Finding(**FINDING)


async def test_an_invalid_synthesis_answer_gets_the_same_output_retries_as_a_normal_turn() -> None:
    envelope = {"output": FINDING, "gaps": ["the store was not read"]}
    script = {"turns": [call("fetch", url="a"), {"text": "not json"},
                        {"text": json.dumps(envelope)}]}  # fmt: skip
    agent = scripted(script, Finding, loop_threshold=2)
    result = await agent.arun("q")
    assert result.status == "completed", result.failure
    assert result.synthesized == "repeated_tool" and result.partial
    assert result.gaps == ("the store was not read",) and result.model_calls == 3
    events = agent.store.events(result.run_id)
    assert [e.text for e in events if isinstance(e, OutputRejected)] == ["not json"]


async def test_a_synthesis_answer_with_no_budget_left_for_a_retry_fails_invalid_output() -> None:
    script = {"turns": [call("fetch", url="a")], "on_synthesis": {"text": "not json"}}
    result = await scripted(script, Finding, max_model_calls=2).arun("q")
    assert result.failure is not None and result.failure.kind == "InvalidOutput"
    assert "no model call" in result.failure.message


# --- the live answer file --------------------------------------------------------------------


def live_file_in(directory: Path, text: str = "half an answer") -> Path:
    """A run's live file in `directory`, with `text` streamed to it."""
    file = LiveFiles(directory).for_run("r1")
    file(TextDelta(text, 1, 1))
    file.close()
    return file.path


def test_the_live_folder_keel_ui_makes_is_private_and_its_file_is_written(tmp_path: Path) -> None:
    store = tmp_path / "runs.sqlite"
    os.umask(old := os.umask(0o022))
    try:
        LiveTexts(store)
    finally:
        os.umask(old)
    assert stat.S_IMODE(live_dir(store).stat().st_mode) == 0o700
    path = live_file_in(live_dir(store))
    assert path.read_bytes().endswith(b"half an answer")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_live_file_is_not_written_through_a_link_planted_in_its_place(tmp_path: Path) -> None:
    directory = tmp_path / "runs.sqlite.live"
    directory.mkdir(mode=0o700)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    live_path(directory, "r1").symlink_to(victim)
    live_file_in(directory)
    assert victim.read_text() == "keep me"
    assert read(live_path(directory, "r1")) is None  # nor read through it by the UI


@pytest.mark.parametrize("mode", [0o755, 0o777, 0o1777])
def test_a_live_folder_others_may_enter_is_not_written_in(tmp_path: Path, mode: int) -> None:
    directory = tmp_path / "runs.sqlite.live"
    directory.mkdir()
    directory.chmod(mode)
    live_file_in(directory)
    assert list(directory.iterdir()) == []


def test_a_live_folder_that_is_a_link_is_not_written_in(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    directory = tmp_path / "runs.sqlite.live"
    directory.symlink_to(elsewhere)
    live_file_in(directory)
    assert list(elsewhere.iterdir()) == []


def test_a_live_folder_of_another_owner_is_not_written_in(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("making a folder of another owner needs root")
    directory = tmp_path / "runs.sqlite.live"
    directory.mkdir(mode=0o700)
    os.chown(directory, 65534, 65534)
    live_file_in(directory)
    assert list(directory.iterdir()) == []


# --- the API key, never kept from what the model said ----------------------------------------

KEY = "sk-proj-Vq3xT9Lm2Rk8Wz4Np6Bd1Hs5Jf7Gc0Ya2Ue4Io6Pl8KnT3BlbkFJx9q"


def echoes_the_key(vendor: str) -> httpx.Response:
    """A model (or a proxy in front of it) that says the key back in its answer."""
    text = f"Your key is {KEY}; keep it safe."
    if vendor == "responses":
        content = [{"type": "output_text", "annotations": [], "text": text}]
        message = {"id": "msg_1", "type": "message", "status": "completed",
                   "role": "assistant", "content": content}  # fmt: skip
        usage = {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15}
        return case_openai_responses._response([message], usage)
    if vendor == "chat":
        return case_openai_chat._completion({"content": text}, "stop",
                                            case_openai_chat._usage(10, 0, 5))  # fmt: skip
    block = {"type": "text", "text": text}
    usage = {"input_tokens": 10, "output_tokens": 5}
    return case_anthropic._message([block], "end_turn", usage)


def keyed_transport(vendor: str, http: httpx.AsyncClient) -> Any:
    if vendor == "responses":
        return OpenAIResponsesTransport("gpt-4o", http_client=http, api_key=KEY)
    if vendor == "chat":
        return OpenAIChatTransport("gpt-4o", http_client=http, api_key=KEY)
    return AnthropicTransport("claude-sonnet-4-5", http_client=http, api_key=KEY)


@pytest.mark.parametrize("vendor", ["responses", "chat", "anthropic"])
async def test_a_key_the_model_says_back_is_scrubbed_from_the_answer_and_the_store(
    vendor: str, tmp_path: Path
) -> None:
    server = Recorder(echoes_the_key(vendor))
    db = tmp_path / "runs.sqlite"
    agent = keel.Agent(keyed_transport(vendor, server.http()), store=keel.Store(str(db)))
    result = await agent.arun("What is my key?")
    assert result.status == "completed", result.failure
    assert result.answer == "Your key is [redacted]; keep it safe."
    assert all(KEY not in repr(e) for e in agent.store.events(result.run_id))
    agent.store.close()
    assert KEY.encode() not in b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.is_file())


def test_keel_run_scrubs_the_api_key_env_key_from_the_answer(tmp_path: Path) -> None:
    class Echo(QuietHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["content-length"]))
            self.reply(echoes_the_key("chat").content)

    db = tmp_path / "runs.sqlite"
    with serving(ThreadingHTTPServer(("127.0.0.1", 0), Echo)) as server:
        base = f"http://127.0.0.1:{server.server_address[1]}/v1"
        out = CliRunner(env={"MY_PROXY_KEY": KEY}).invoke(
            app, ["run", "What is my key?", "--model", "openai-chat:house", "--base-url", base,
                  "--api-key-env", "MY_PROXY_KEY", "--store", str(db), "--json"],
        )  # fmt: skip
    assert out.exit_code == 0, out.stderr
    assert json.loads(out.stdout)["answer"] == "Your key is [redacted]; keep it safe."
    assert KEY not in out.stdout + out.stderr
    assert KEY.encode() not in b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.is_file())


async def test_a_streamed_key_split_across_deltas_never_reaches_a_text_listener() -> None:
    class Streaming:
        name = "streaming"
        streams = True

        def secret(self) -> str:
            return KEY

        async def request(self, request: keel.ModelRequest) -> keel.ModelResponse:
            raise AssertionError("a run with a text listener streams")

        async def request_streaming(self, request: keel.ModelRequest, on_text: Any) -> Any:
            text = f"key: {KEY} end"
            for i in range(0, len(text), 7):
                on_text(text[i : i + 7])
            return keel.ModelResponse(text=text, stop_reason="stop")

    heard: list[str] = []
    agent = keel.Agent(Streaming(), store=keel.Store(":memory:"),
                       text_listeners=[lambda e: heard.append(getattr(e, "text", ""))])  # fmt: skip
    result = await agent.arun("q")
    assert result.answer == "key: [redacted] end"
    assert "".join(heard) == "key: [redacted] end"
