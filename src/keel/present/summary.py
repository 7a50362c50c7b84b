"""What a finished run did, in one line for a person, and the exact command that opens it.

``keel run`` prints both after the answer (on stderr), so a newcomer sees at a glance whether
the model researched (which tools it called, how often), whether the answer came from a
synthesis turn, and how to look at the whole run: ``keel show RUN_ID``, with ``--store PATH``
when the run was saved somewhere other than the default store; an interrupted (cancelled) run
gets the ``keel resume`` command that continues it.
"""

from __future__ import annotations

import shlex
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from keel.records import Event, ToolCallRequested, ToolChoiceIgnored
from keel.result import RunResult
from keel.store.locate import is_url

__all__ = ["one_line", "resume_command", "show_command"]


def one_line(result: RunResult, events: Iterable[Event]) -> str:
    """``tools: read_file x2, list_files · answer: synthesized (repeated_tool)``, and the like."""
    events = list(events)
    called = Counter(e.name for e in events if isinstance(e, ToolCallRequested))
    ignored = [e.step for e in events if isinstance(e, ToolChoiceIgnored)]
    tools = ", ".join(f"{name} x{n}" if n > 1 else name for name, n in called.items())
    if result.status == "completed":
        end = (
            f"answer: synthesized ({result.synthesized})"
            if result.synthesized
            else "answer: not synthesized"
        )
        if result.cut_off:
            end += ", cut off at the output limit or the model timeout"
    elif result.failure is not None:
        end = f"failed: {result.failure.kind}"
    elif result.status == "cancelled":
        end = "interrupted (cancelled): it can be resumed"
    else:
        end = result.status.replace("_", " ")
    line = f"tools called: {tools or 'none'} · {end}"
    if ignored:
        steps = ", ".join(str(s) for s in ignored)
        line += (
            f" · tool_choice \"required\" ignored by the model's server (step {steps}): "
            "an answer without a tool call"
        )
    return line


def show_command(run_id: str, store: str | Path, default: Path) -> str:
    """The ``keel show`` command for this run, as a shell line: ``--store`` only when needed."""
    return _command("show", run_id, store, default)


def resume_command(run_id: str, store: str | Path, default: Path) -> str:
    """The ``keel resume`` command that continues an interrupted run, as a shell line."""
    return _command("resume", run_id, store, default)


def _command(verb: str, run_id: str, store: str | Path, default: Path) -> str:
    words = ["keel", verb, run_id]
    if str(store) == ":memory:":
        return shlex.join(words)
    if is_url(str(store)) or Path(store).resolve() != default.resolve():
        words += ["--store", str(store)]
    return shlex.join(words)
