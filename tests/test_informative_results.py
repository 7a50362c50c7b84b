"""The repeat tiers rest on what a result says (docs/adr/0064): a result that says nothing (an
empty output wrapper, a success status alone, a tool's fixed success line, a bare
acknowledgement) never makes a `same_result` chain, and a side effect answered by one took.
Each case is the false positive the held-out recordings showed, on the live loop or through
`keel replay` with a reader that already existed before the change."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import keel
from keel.cli.app import app
from keel.informative import NOTHING_DIGESTS, says_nothing
from keel.messages import digest_text
from support import call, run_script

EMPTY_WRAPPER = "<returncode>0</returncode>\n<output>\n</output>"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "  \n",
        EMPTY_WRAPPER,
        "<returncode>0</returncode><output></output>",
        "Your command ran successfully and did not produce any output.",
        "\n[The command completed with exit code 0.]",
        "[Command finished with exit code 0]\n[Current working directory: /workspace]",
        "The file /home/dev/app/src/retry.py has been updated successfully.",
        "File created successfully at: /tmp/x/test_retry.py",
        "OK",
        "done.",
        "Exit code: 0",
    ],
)
def test_a_result_that_says_nothing_is_told_apart(text: str) -> None:
    assert says_nothing(text)


@pytest.mark.parametrize(
    "text",
    [
        "No matches found.",
        "<returncode>1</returncode>\n<output>\n</output>",  # a failure: it says it failed
        "\n[The command completed with exit code 1.]",
        "<returncode>0</returncode>\n<output>\n8.2\n</output>",
        "The file /x.py has been updated. Here's the result of running `cat -n`:\n 1\tdef f():",
        "Your proposed edit has introduced new syntax error(s).",
        "appended 8 characters to log.txt (it now holds 24 bytes)",
    ],
)
def test_a_result_that_says_something_is_kept(text: str) -> None:
    assert not says_nothing(text)


def test_the_live_loop_knows_the_acknowledgements_by_their_digest() -> None:
    assert digest_text("ok") in NOTHING_DIGESTS and digest_text("Done.\n") in NOTHING_DIGESTS
    assert digest_text("No matches found.") not in NOTHING_DIGESTS


@keel.tool(effect="side_effecting")
def set_flag(flag: str) -> str:
    """Set a feature flag."""
    return "ok"


async def test_an_acknowledged_side_effect_never_makes_a_same_result_chain() -> None:
    """Six flags set, each answered "ok": progress, not a loop (the tier's chain used to bring
    the synthesis turn at the fourth)."""
    turns = [call("set_flag", flag=f"flag{n}") for n in range(6)]
    script = {"turns": [*turns, {"text": "All set."}], "on_synthesis": {"text": "Cut."}}
    out = await run_script(script, [set_flag], repeat_same_result=True)
    assert out.result.synthesized is None and out.result.answer == "All set."


@keel.tool(effect="side_effecting")
def update_file(path: str, text: str) -> str:
    """Rewrite a file."""
    return f"The file {path} has been updated successfully."


async def test_a_side_effect_answered_by_a_fixed_success_line_is_progress_live() -> None:
    """Six different edits of one file, each answered by the tool's fixed success line naming
    its path (the same bytes each time): the live loop reads the result's text, not only its
    digest, so no same_result chain forms (Claude Code's `Edit`s on the held-out sessions)."""
    turns = [call("update_file", path="src/m.py", text=f"v{n}") for n in range(6)]
    script = {"turns": [*turns, {"text": "Updated."}], "on_synthesis": {"text": "Cut."}}
    out = await run_script(script, [update_file], repeat_same_result=True)
    assert out.result.synthesized is None and out.result.answer == "Updated."


def _chat(results: list[str]) -> dict[str, object]:
    """An OpenAI chat message list: one `bash` call per turn, each a different command."""
    messages: list[dict[str, object]] = [{"role": "user", "content": "Fix the parser."}]
    for n, result in enumerate(results):
        command = f"sed -i 's/old{n}/new{n}/' src/parser.py"
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"c{n}",
                        "type": "function",
                        "function": {"name": "bash", "arguments": json.dumps({"command": command})},
                    }
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": f"c{n}", "content": result})
    return {"id": "edits", "messages": messages}


def _replayed(path: Path, *args: str) -> list[dict[str, object]]:
    out = CliRunner().invoke(app, ["replay", str(path), "--json", "--tiers", "same_result", *args])
    assert out.exit_code == 0, out.output
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def test_edits_answered_by_an_empty_output_wrapper_are_not_a_loop(tmp_path: Path) -> None:
    """The held-out mini-swe-agent runs' false positive: different `sed -i` edits, each
    answered `<returncode>0</returncode><output></output>`."""
    path = tmp_path / "edits.json"
    path.write_text(json.dumps(_chat([EMPTY_WRAPPER] * 6)))
    (run,) = _replayed(path)
    assert run["synthesis_after"] is None and run["loops"] == {}


def test_a_command_failing_alike_under_new_arguments_is_still_a_loop(tmp_path: Path) -> None:
    path = tmp_path / "failing.json"
    path.write_text(json.dumps(_chat(["<returncode>1</returncode>\n<output>\n</output>"] * 6)))
    (run,) = _replayed(path)
    assert run["synthesis_after"] == 3 and run["tier"] == "same_result"


def _session(results: list[str], first: dict[str, object] | None = None) -> str:
    """A Claude Code session: one `Edit` per message, each of another line."""
    lines = [first] if first else []
    session = "5b1f0c2e-0000-4000-8000-00000000a001"
    for n, result in enumerate(results):
        use = {
            "type": "tool_use",
            "id": f"toolu_{n}",
            "name": "Edit",
            "input": {"file_path": "/app/retry.py", "old_string": f"a{n}", "new_string": f"b{n}"},
        }
        lines.append(
            {
                "type": "assistant",
                "sessionId": session,
                "message": {"id": f"msg_{n}", "role": "assistant", "content": [use]},
            }
        )
        answer = {"type": "tool_result", "tool_use_id": f"toolu_{n}", "content": result}
        lines.append(
            {"type": "user", "sessionId": session, "message": {"role": "user", "content": [answer]}}
        )
    return "\n".join(json.dumps(line) for line in lines) + "\n"


def test_claude_code_edits_that_each_took_are_not_a_loop(tmp_path: Path) -> None:
    """The long Claude Code sessions' false positive: `Edit`s answered "The file ... has been
    updated successfully." each time."""
    path = tmp_path / "session.jsonl"
    path.write_text(_session(["The file /app/retry.py has been updated successfully."] * 6))
    (run,) = _replayed(path)
    assert run["synthesis_after"] is None
