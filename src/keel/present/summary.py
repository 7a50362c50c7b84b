"""What a finished run did, in one line for a person, and the exact command that opens it.

``keel run`` prints both after the answer (on stderr), so a newcomer sees at a glance whether
the model researched (which tools it called, how often), whether the answer came from a
synthesis turn, and how to look at the whole run: ``keel show RUN_ID``, with ``--store PATH``
when the run was saved somewhere other than the default store (``make run`` keeps its runs in
``.venv/demo.sqlite``).
"""

from __future__ import annotations

import shlex
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from keel.records import Event, ToolCallRequested
from keel.result import RunResult

__all__ = ["one_line", "show_command"]


def one_line(result: RunResult, events: Iterable[Event]) -> str:
    """``tools: read_file x2, list_files · answer: synthesized (repeated_tool)``, and the like."""
    called = Counter(e.name for e in events if isinstance(e, ToolCallRequested))
    tools = ", ".join(f"{name} x{n}" if n > 1 else name for name, n in called.items())
    if result.status == "completed":
        end = (
            f"answer: synthesized ({result.synthesized})"
            if result.synthesized
            else "answer: not synthesized"
        )
        if result.cut_off:
            end += ", cut off at the output limit"
    elif result.failure is not None:
        end = f"failed: {result.failure.kind}"
    else:
        end = result.status.replace("_", " ")
    return f"tools called: {tools or 'none'} · {end}"


def show_command(run_id: str, store: str | Path, default: Path) -> str:
    """The ``keel show`` command for this run, as a shell line: ``--store`` only when needed."""
    words = ["keel", "show", run_id]
    if str(store) != ":memory:" and Path(store).resolve() != default.resolve():
        words += ["--store", str(store)]
    return shlex.join(words)
