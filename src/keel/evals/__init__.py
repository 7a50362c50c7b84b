"""Scenario evaluations: the real runtime, real tools, pages served on loopback, a scripted
model (or a real one), and an expected outcome per scenario. `keel eval` runs them; the
built-in scenarios guard the rules of docs/design.md (and the ADRs it points to).
"""

from keel.evals.loading import builtin_names, load_file, resolve
from keel.evals.pageserver import PageServer
from keel.evals.runner import RunRow, ScenarioReport, run_once, run_scenarios
from keel.evals.scenario import Scenario

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
