"""The run core, internal: what advances one run from its question to its end.

    openings   the ways a run opens (fresh, follow-up, resumed, queued, child, forked), as values
    loop       the `while` over steps; what lasts across steps (state, lease, checkpoint)
    step       one step as a function: parts in, one outcome out
    parts      what a step works with (`StepParts`) and its outcomes, below the modules using them
    turns      one model turn: mode, request, attempts, retries, the empty-turn rule
    batch      answering a batch: approvals, denials, dispatch, journal, evidence resets
    breaker    the identical-call counters and their policy
    synthesis  the mode of the next turn and the volatile controls
    budgets    the budgets and the deadline clock
    context    the context builder (history, elisions, the request)
    gateway    one model attempt through a transport, and the retry policy
    recorder   events and checkpoints of a step, handed to the store (and the ledger, keel.ledger)
    lease      one process advances a run at a time
    resume     rebuilding a stored run where it stopped
    fork       a fork's prefix: a run's first steps and what stood after them
    tree       a parent's children: their carve-outs, spend and pauses

Nothing here is public API: programs use `keel.Agent` and the names `keel` exports, which do
not move when these modules do (docs/design.md, "Where the code lives"). Modules outside the
run core import it through this face only, as trio keeps `_core` (tests/test_import_graph.py);
the names load from their modules on first use (keel/_lazy.py), so importing one costs only
the modules it needs.
"""

import typing as _typing

from keel import _lazy

if _typing.TYPE_CHECKING:
    from keel._run.breaker import tier_of
    from keel._run.child_queue import CHILD_QUEUE, ChildQueue
    from keel._run.context import ContextBuilder
    from keel._run.fork import (
        ForkPrefix,
        create_fork,
        derive,
        fork_point,
        forked_from,
        prefix_of_run,
    )
    from keel._run.history import continuation
    from keel._run.loop import RunLoop
    from keel._run.openings import (
        Child,
        FollowUp,
        Forked,
        ForkOf,
        Fresh,
        Opened,
        Opening,
        Queued,
        Resumed,
        new_run_id,
    )
    from keel._run.parts import RunSetup
    from keel._run.recorder import Listener
    from keel._run.synthesis import CONTROLS, NUDGE_PREFIX
    from keel._run.tree import CURRENT, Delegations, qualified

_WHERE: dict[str, str] = {
    "tier_of": "keel._run.breaker",
    "CHILD_QUEUE": "keel._run.child_queue",
    "ChildQueue": "keel._run.child_queue",
    "ContextBuilder": "keel._run.context",
    "ForkPrefix": "keel._run.fork",
    "create_fork": "keel._run.fork",
    "derive": "keel._run.fork",
    "fork_point": "keel._run.fork",
    "forked_from": "keel._run.fork",
    "prefix_of_run": "keel._run.fork",
    "CONTROLS": "keel._run.synthesis",
    "NUDGE_PREFIX": "keel._run.synthesis",
    "continuation": "keel._run.history",
    "RunLoop": "keel._run.loop",
    "RunSetup": "keel._run.parts",
    "Child": "keel._run.openings",
    "FollowUp": "keel._run.openings",
    "ForkOf": "keel._run.openings",
    "Forked": "keel._run.openings",
    "Fresh": "keel._run.openings",
    "Opened": "keel._run.openings",
    "Opening": "keel._run.openings",
    "Queued": "keel._run.openings",
    "Resumed": "keel._run.openings",
    "new_run_id": "keel._run.openings",
    "Listener": "keel._run.recorder",
    "CURRENT": "keel._run.tree",
    "Delegations": "keel._run.tree",
    "qualified": "keel._run.tree",
}

__all__ = [
    "CHILD_QUEUE",
    "CONTROLS",
    "CURRENT",
    "NUDGE_PREFIX",
    "Child",
    "ChildQueue",
    "ContextBuilder",
    "Delegations",
    "FollowUp",
    "ForkOf",
    "ForkPrefix",
    "Forked",
    "Fresh",
    "Listener",
    "Opened",
    "Opening",
    "Queued",
    "Resumed",
    "RunLoop",
    "RunSetup",
    "continuation",
    "create_fork",
    "derive",
    "fork_point",
    "forked_from",
    "new_run_id",
    "prefix_of_run",
    "qualified",
    "tier_of",
]
__getattr__, __dir__ = _lazy.exports(__name__, _WHERE)
