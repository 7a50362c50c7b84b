"""The required first turn names the call to start with (issue 25): told only to start with a
tool, the local model listed `/path/to/repository` four times for a question naming a
constant, and read a module's whole text for a question about its imports. The control now
names the exact call, chosen from the question's words among the tools the run offers."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

import keel
from keel._run.synthesis import FIRST_CALL_CONTROL
from keel.transports.local.steering import first_call
from keel.transports.scripted import ScriptedTransport
from support import call

TOOLS = {"list_files", "read_file", "search_files"}


def test_an_imports_question_about_a_file_starts_with_its_import_lines() -> None:
    question = "Which modules does the run loop in src/keel/_run/loop.py depend on?"
    assert first_call(question, TOOLS) == (
        'search_files {"pattern": "^(from|import) ", "path": "src/keel/_run/loop.py"}'
    )


def test_a_question_naming_a_file_starts_by_reading_it() -> None:
    question = "What does src/keel/tools/guidance.py tell the model?"
    assert first_call(question, TOOLS) == 'read_file {"path": "src/keel/tools/guidance.py"}'


def test_an_exports_question_about_a_file_starts_with_its_all_line() -> None:
    question = "Which names does src/keel/tools/guidance.py export in its __all__?"
    assert first_call(question, TOOLS) == (
        'search_files {"pattern": "^__all__ = ", "path": "src/keel/tools/guidance.py"}'
    )


def test_a_question_about_a_function_in_a_file_starts_with_its_def_line() -> None:
    """The whole module, read first, was cut before the function four times in a row."""
    question = "What parameters does the function decide_mode in src/keel/_run/synthesis.py take?"
    assert first_call(question, TOOLS) == (
        'search_files {"pattern": "def decide_mode\\\\b", "path": "src/keel/_run/synthesis.py"}'
    )
    plain = "What is the default value of loop_threshold in the Limits class in src/keel/limits.py?"
    assert first_call(plain, TOOLS) == 'read_file {"path": "src/keel/limits.py"}'


def test_a_question_naming_only_a_code_name_starts_by_searching_for_it() -> None:
    question = "In which file is the constant MAX_READ_LINES defined?"
    assert first_call(question, TOOLS) == 'search_files {"pattern": "MAX_READ_LINES"}'


def test_a_question_naming_no_file_starts_by_searching_for_its_words() -> None:
    """Issue 39: the 1.5B model began such a question with ``read_file example.txt``, a path
    it invented; the first call looks at what exists instead."""
    question = "Which exception does a tool request in a synthesis-only turn fail the run with?"
    assert first_call(question, TOOLS) == 'search_files {"pattern": "(?i)synthesis-only"}'
    question = "How does the run loop stop a repeating call?"
    assert first_call(question, TOOLS) == 'search_files {"pattern": "(?i)repeating"}'
    assert first_call("Which exceptions are there?", TOOLS) == (
        'search_files {"pattern": "(?i)exception"}'
    )


def test_a_question_of_common_words_only_starts_by_listing_the_root() -> None:
    assert first_call("What is in here?", TOOLS) == 'list_files {"path": "."}'
    assert first_call("What is in here?", {"read_file"}) is None


def test_nothing_is_named_without_the_tool_for_it() -> None:
    assert first_call("Read src/keel/agent.py.", {"fetch"}) is None
    assert first_call("How does the run loop stop a repeating call?", {"fetch"}) is None


class SteeredScript(ScriptedTransport):
    """A script standing in for a model that steers its first call as the local one does (a
    plain script steers nothing)."""

    def first_call(self, question: str, tools: Collection[str]) -> str | None:
        return first_call(question, tools)


async def test_the_first_turns_control_names_the_call(tmp_path: Path) -> None:
    (tmp_path / "loop.py").write_text("import asyncio\n")
    files = keel.file_tools(tmp_path)
    script = {"turns": [call("read_file", path="loop.py"), {"text": "asyncio."}]}
    transport = SteeredScript.from_dict(script, record=True)
    agent = keel.Agent(transport, tools=files, limits=keel.Limits(first_turn_tool=True))
    await agent.arun("What is in loop.py?")
    (control,) = transport.requests[0].volatile
    assert control == f'{FIRST_CALL_CONTROL} Here that is: read_file {{"path": "loop.py"}}'


def test_the_local_transport_can_be_asked_to_name_no_first_call() -> None:
    """For measuring the steering (issue 39): nothing is loaded to answer."""
    from keel.transports.local import LocalTransport

    question = "In which file is the constant MAX_READ_LINES defined?"
    assert LocalTransport().first_call(question, TOOLS) == first_call(question, TOOLS)
    assert LocalTransport(steering=False).first_call(question, TOOLS) is None
