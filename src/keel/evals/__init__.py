"""Scenario evaluations: the real runtime, real tools, pages served on loopback, a scripted
model (or a real one), and an expected outcome per scenario. `keel eval` runs them; the
built-in scenarios guard the rules of docs/design.md (and the ADRs it points to).
"""

# The command line imports `keel.evals.command` on every start, and with it this package: its
# names are imported on first use (keel/_lazy.py, ADR 0042).
import typing as _typing

from keel import _lazy

if _typing.TYPE_CHECKING:
    from keel.evals.judging import RunRow, ScenarioReport
    from keel.evals.loading import builtin_names, load_file, resolve
    from keel.evals.pageserver import PageServer
    from keel.evals.runner import run_once, run_scenarios
    from keel.evals.scenario import Scenario

_WHERE: dict[str, str] = {
    "PageServer": "keel.evals.pageserver",
    "RunRow": "keel.evals.judging",
    "Scenario": "keel.evals.scenario",
    "ScenarioReport": "keel.evals.judging",
    "builtin_names": "keel.evals.loading",
    "load_file": "keel.evals.loading",
    "resolve": "keel.evals.loading",
    "run_once": "keel.evals.runner",
    "run_scenarios": "keel.evals.runner",
}

__all__ = [
    "PageServer",
    "RunRow",
    "Scenario",
    "ScenarioReport",
    "builtin_names",
    "load_file",
    "resolve",
    "run_once",
    "run_scenarios",
]

__getattr__, __dir__ = _lazy.exports(__name__, _WHERE)
