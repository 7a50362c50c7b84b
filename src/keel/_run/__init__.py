"""The run core, internal: what advances one run from its question to its end.

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
    recorder   events and checkpoints of a step, handed to the store
    lease      one process advances a run at a time
    resume     rebuilding a stored run where it stopped

Nothing here is public API: programs use `keel.Agent` and the names `keel` exports, which do
not move when these modules do (docs/design.md, "Where the code lives").
"""
