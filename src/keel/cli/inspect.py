"""The commands that look at stored runs and decide on their pauses: `keel show`, `keel runs`,
`keel approve`, `keel deny`. They open an existing store and never start a model."""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from keel.cli.common import (
    ByOption,
    JsonOption,
    StoreOption,
    err,
    guard,
    json_errors,
    known_run,
    open_run_store,
    resume_line,
    text_of,
    usage_error,
)
from keel.cli.conversation import continues_line, conversation_lines
from keel.cli.fork import forked_json, forked_line
from keel.present.terminal import safe_text

if TYPE_CHECKING:  # each command imports what it uses: `keel --help` needs none (ADR 0042)
    from collections.abc import Sequence

    from keel.limits import Limits
    from keel.records import Event
    from keel.store import RunRecord, RunStore

__all__ = ["approve", "deny", "runs", "show"]


def approve(
    run_id: Annotated[str, typer.Argument(help="The paused run.")],
    call_id: Annotated[
        str | None, typer.Argument(help="The call to approve, by Keel's id (e.g. k2_0).")
    ] = None,
    all_calls: Annotated[bool, typer.Option("--all", help="Approve every pending call.")] = False,
    arguments: Annotated[
        str | None,
        typer.Option(
            "--arguments",
            help="Run the call with these arguments instead (the whole JSON object), checked "
            "against the tool's schema.",
        ),
    ] = None,
    for_run: Annotated[
        bool,
        typer.Option("--for-run", help="Also approve every later call of this tool in the run."),
    ] = False,
    by: ByOption = None,
    store: StoreOption = None,
) -> None:
    """Approve a pending call (or all with --all); `keel resume` then runs it. Final: a call
    someone decided already is refused (exit 2), naming who decided, what and when."""
    from keel import approvals
    from keel.cli.decisions import edited_arguments
    from keel.pool.commands import after_decision

    if (call_id is None) == (not all_calls):
        usage_error("name one CALL_ID, or pass --all (and not both)")
    if arguments is not None and call_id is None:
        usage_error("--arguments edits one call: name its CALL_ID")
    edited = None if arguments is None else edited_arguments(arguments)
    db = open_run_store(store)
    try:
        ids = guard(
            lambda: approvals.approve(db, run_id, call_id, by, arguments=edited, for_run=for_run)
        )
    finally:
        db.close()
    if not ids:
        usage_error(f"run {run_id} has no call awaiting a decision")
    how = (" with edited arguments" if edited is not None else "") + (
        " (and the tool for the rest of the run)" if for_run else ""
    )
    for one in ids:
        typer.echo(f"approved {one}{how}")
    err.print(guard(lambda: after_decision(store, run_id)), highlight=False)


def deny(
    run_id: Annotated[str, typer.Argument(help="The paused run.")],
    call_id: Annotated[str, typer.Argument(help="The call to deny, by Keel's id (e.g. k2_0).")],
    reason: Annotated[str, typer.Option(help="Why; the model is told.")],
    by: ByOption = None,
    store: StoreOption = None,
) -> None:
    """Deny a pending call; the model hears who denied it and why, and not to retry it. Final,
    like an approval."""
    from keel import approvals
    from keel.pool.commands import after_decision

    db = open_run_store(store)
    try:
        guard(lambda: approvals.deny(db, run_id, call_id, reason, by))
    finally:
        db.close()
    typer.echo(f"denied {call_id}")
    err.print(guard(lambda: after_decision(store, run_id)), highlight=False)


@json_errors
def show(
    run_id: Annotated[str, typer.Argument(help="The run's id, as `keel runs` lists it.")],
    as_json: JsonOption = False,
    store: StoreOption = None,
) -> None:
    """Show a run and its timeline: turns, calls, results, elisions, approvals, the end."""
    from keel.present.timeline import json_text, run_json, timeline
    from keel.present.window import window_lines

    db = open_run_store(store, read_only=True)
    try:
        record = guard(lambda: known_run(db, run_id))
        events = guard(lambda: db.events(run_id))
    finally:
        db.close()
    if as_json:
        typer.echo(json_text(_show_json(record, events)))
        return
    out = Console(emoji=False)
    summary = run_json(record)
    _print_header(out, record, summary, db)
    out.print(f"question: {safe_text(record.question)}", highlight=False, markup=False)
    out.print(timeline(events))
    for line in window_lines(record, events):  # the window, and what was elided (issue 44)
        out.print(safe_text(line), highlight=False, markup=False, soft_wrap=True)
    _print_end(out, record, summary)


def _show_json(record: RunRecord, events: Sequence[Event]) -> dict[str, Any]:
    """`keel show --json`: the run, its events, the rules and options it ran with, where it
    stands in its tree and where it branched."""
    from keel.events import event_json
    from keel.present.timeline import run_json

    shown: dict[str, Any] = {
        "run": run_json(record),
        "events": [event_json(e) for e in events],
    }
    shown["loop_rules"] = _loop_rules(record.config.limits)
    shown["window"] = record.config.settings.get("window")
    shown["options"] = record.config.settings.get("options") or {}
    shown["parent"] = parent_json(record)
    shown["forked_from"] = forked_json(record)
    if record.state.waiting:  # queued children it waits for (ADR 0069)
        shown["waiting_for"] = list(record.state.waiting)
    sampling = record.config.settings.get("sampling")  # a local model's pinned sampling
    if sampling is not None:
        shown["sampling"] = sampling
    return shown


def _print_header(out: Console, record: RunRecord, summary: dict[str, Any], db: RunStore) -> None:
    """What the run is before its timeline: model, sampling, rules, options, lineage."""
    from keel.models import endpoint

    where = endpoint(record.config.model, text_of(record.config.settings.get("base_url")))
    out.print(
        f"{record.run_id} · {summary['status']} · model {safe_text(record.model)} at "
        f"{safe_text(where)}",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )
    sampling = record.config.settings.get("sampling")
    if isinstance(sampling, dict):
        pinned = ", ".join(f"{k} {v}" for k, v in sampling.items())
        out.print(f"sampling: {safe_text(pinned)}", highlight=False, markup=False)
    rules = _loop_rules(record.config.limits)
    out.print(
        f"loop rules: policy {rules['policy']}, threshold {rules['threshold']}, "
        f"evidence resets {rules['evidence_reset_cap']} per key, "
        f"tiers {', '.join(rules['tiers']) or 'none'}{', nudge' if rules['nudge'] else ''}",
        highlight=False,
        markup=False,
    )
    first_turn = first_turn_line(record)
    if first_turn is not None:
        out.print(first_turn, highlight=False, markup=False)
    chosen = options_line(record)
    if chosen is not None:
        out.print(safe_text(chosen), highlight=False, markup=False, soft_wrap=True)
    if record.status == "cancelled":
        out.print(
            f"interrupted at step {record.state.step}; continue it with: "
            f"{resume_line(record.run_id, db)}",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
    follows = continues_line(record)
    if follows is not None:
        out.print(follows, highlight=False, markup=False)
    branch = forked_line(record)
    if branch is not None:
        out.print(safe_text(branch), highlight=False, markup=False, soft_wrap=True)
    for line in tree_lines(record):
        out.print(safe_text(line), highlight=False, markup=False, soft_wrap=True)


def _print_end(out: Console, record: RunRecord, summary: dict[str, Any]) -> None:
    """What the run spent and how it ended: the answer, its citations checked, its gaps."""
    from keel.pricing import cost_text

    state = record.state
    out.print(
        f"spent: {state.model_calls} model calls · {state.tool_calls} tool calls · "
        f"{state.usage.input_tokens}+{state.usage.output_tokens} tokens"
        f"{' (estimated)' if state.usage.estimated else ''} · "
        f"{cost_text(state.cost)}{children_spent(record)}",
        highlight=False,
        markup=False,
    )
    if summary["answer"]:
        out.print(f"\nanswer: {safe_text(summary['answer'])}", highlight=False, markup=False)
    evidence = summary.get("evidence")
    if isinstance(evidence, dict):
        from keel.citations import summary_line

        line = f"evidence: {summary_line(evidence)}"
        out.print(safe_text(line), highlight=False, markup=False, soft_wrap=True)
        for gap in summary["gaps"] if summary["partial"] else ():
            out.print(f"  gap: {safe_text(gap)}", highlight=False, markup=False, soft_wrap=True)


def parent_json(record: RunRecord) -> dict[str, str | None] | None:
    config = record.config
    if config.parent_run is None:
        return None
    return {"run_id": config.parent_run, "call_id": config.parent_call, "agent": config.agent}


def tree_lines(record: RunRecord) -> list[str]:
    """Where a run stands in its tree (sub-agents): its parent, and the children it has
    answered, each with how it ended and what it spent."""
    config, lines = record.config, []
    if config.parent_run is not None:
        lines.append(
            f"parent: {config.parent_run} (call {config.parent_call}, as agent {config.agent})"
        )
    for call_id, child in record.state.children.items():
        how = child.status + (f" (synthesized: {child.synthesized})" if child.synthesized else "")
        lines.append(
            f"child: {child.run_id} (call {call_id}, agent {child.agent}) {how} · "
            f"{child.model_calls} model calls · {child.tool_calls} tool calls"
        )
    for child_run in record.state.waiting:  # queued children not ended yet (ADR 0069)
        lines.append(f"waiting for child: {child_run} (a keel worker runs it)")
    return lines


def children_spent(record: RunRecord) -> str:
    """`keel show`'s spent line counts the children in; this says how much was theirs."""
    children = record.state.children.values()
    if not children:
        return ""
    calls = sum(c.model_calls for c in children)
    tools = sum(c.tool_calls for c in children)
    return f" (of which children: {calls} model calls · {tools} tool calls)"


def options_line(record: RunRecord) -> str | None:
    """The options the run did not leave at their defaults, and where each came from (a flag,
    a variable, a keel.toml), as the command line resolved them (keel/run_options.py)."""
    saved = record.config.settings.get("options")
    if not isinstance(saved, dict) or not saved:
        return None
    shown = []
    for name, entry in saved.items():
        if not isinstance(entry, dict):
            continue
        value = f" {entry['value']}" if "value" in entry else ""
        shown.append(f"{name}{value} ({entry.get('from')})")
    return "options: " + ", ".join(shown)


RUN_ID = re.compile(r"run_[0-9a-f]{16}")


def first_turn_line(record: RunRecord) -> str | None:
    """Whether the run's first turn had to call a tool, and who chose it (issue 25)."""
    how = record.config.settings.get("first_turn_tool")
    if record.config.limits.first_turn_tool:
        why = {"default": "the default for the local model", "given": "--first-turn-tool"}
        return f"first turn: must call a tool ({why.get(str(how), 'Limits.first_turn_tool')})"
    if how == "given":
        return "first turn: may answer without a tool (--no-first-turn-tool)"
    return None


def _loop_rules(limits: Limits) -> dict[str, Any]:
    """The identical-call rules a run was started with (and resumes with)."""
    return {
        "policy": limits.loop_policy,
        "threshold": limits.loop_threshold,
        "evidence_reset_cap": limits.evidence_reset_cap,
        "tiers": list(limits.repeat_tiers),
        "nudge": limits.nudge,
    }


def runs(
    store: StoreOption = None,
    limit: Annotated[int, typer.Option(help="How many runs to list.")] = 20,
    status: Annotated[
        str | None,
        typer.Option(
            help="Only runs in this status: queued, running, awaiting_approval, "
            "awaiting_children, ..."
        ),
    ] = None,
) -> None:
    """List recent runs, newest first."""
    from keel.pricing import cost_text
    from keel.result import STATUSES

    if status is not None and status not in STATUSES:
        usage_error(f"--status must be one of {', '.join(STATUSES)}")
    db = open_run_store(store, read_only=True)
    try:
        records = guard(lambda: db.list_runs(limit, status))
    finally:
        db.close()

    def line(r: RunRecord) -> str:
        started = time.strftime("%Y-%m-%d %H:%M", time.localtime(r.created_at))
        return (
            f"{r.run_id}  {started}  {r.status:<17} {r.state.model_calls:>5} "
            f"{r.state.tool_calls:>5} {cost_text(r.state.cost):>12}  "
            f"{safe_text(r.question[:70])}"
        )

    if records:  # the columns named once; the started time is local
        typer.echo(
            f"{'RUN':<20}  {'STARTED':<16}  {'STATUS':<17} {'MODEL':>5} {'TOOLS':>5} "
            f"{'COST':>12}  QUESTION"
        )

    listed = {r.run_id for r in records}
    children: dict[str, list[RunRecord]] = {}
    for r in records:
        if r.config.parent_run in listed:
            children.setdefault(str(r.config.parent_run), []).append(r)
    top = [r for r in records if r.config.parent_run not in listed]
    for text in conversation_lines(top, line):
        typer.echo(text)
        found = RUN_ID.search(text)
        for child in reversed(children.get(found.group(0) if found else "", [])):
            typer.echo(safe_text(f"  └ {child.config.agent}: " + line(child)))
    interrupted = [r.run_id for r in records if r.status == "cancelled"]
    if interrupted:
        typer.echo(
            f"\ncancelled runs were interrupted, not ended; continue one with: "
            f"{resume_line(interrupted[0], db)}"
        )
