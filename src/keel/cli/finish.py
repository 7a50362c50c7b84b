"""How a command's run ends on the terminal: the header that says where requests go, the
answer or the JSON, the one-line summary, and the exit code of the run's status."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn

import typer

from keel.cli.common import EXIT_CODES, err, guard, resume_line
from keel.cli.output import Stdout
from keel.cli.signals import Signals
from keel.models import endpoint
from keel.present.terminal import describe_call, safe_text

if TYPE_CHECKING:
    from keel.agent import Agent, RunHandle
    from keel.cli.flags import CommandAgent
    from keel.cli.integrations import RunExtras
    from keel.result import RunResult

__all__ = ["announce", "finish", "header", "print_result"]


def announce(built: CommandAgent) -> None:
    """Before the run (not with --json or --events, whose output stays exactly theirs): where
    its requests go, and which folder the file tools read when --repo did not say."""
    if built.extras.quiet:
        return
    values, sources = built.resolved.values, built.resolved.sources
    header(values["model"], values["base_url"], sources["model"])
    if not built.resolved.given("repo"):
        err.print(
            f"repo: {safe_text(str(built.folder))} (the current folder; --repo DIR to choose)",
            highlight=False,
            markup=False,
            soft_wrap=True,
            style="dim",
        )


def header(spec: str, base_url: str | None, source: str) -> None:
    """Where the run's requests (and the API key) go, before anything is sent."""
    err.print(
        f"model {safe_text(spec)} at {safe_text(endpoint(spec, base_url))} (from {source})",
        highlight=False,
        markup=False,
        soft_wrap=True,
        style="dim",
    )


def finish(agent: Agent, start: Callable[[], RunHandle], extras: RunExtras) -> NoReturn:
    from keel.present.progress import watch_local_model
    from keel.present.summary import one_line, show_command
    from keel.store.locate import default_store_path

    guard(extras.start_export)
    with extras, agent:
        if not extras.quiet:
            watch_local_model(agent, extras.screen)
        result = guard(lambda: Signals.active().run(start))
        summary = one_line(result, agent.store.events(result.run_id))
        opening = show_command(result.run_id, agent.store.path, default_store_path())
        if result.status == "cancelled":  # an interruption: say how to go on
            opening += f"\ncontinue it with: {resume_line(result.run_id, agent.store)}"
    if not extras.wrote(result):
        shown = result.answer is not None and extras.answer_shown(result.answer)
        print_result(result, extras.as_json, extras.out, answer_shown=shown)
    if extras.out.failure is not None:  # the run is stored: say where, in one line
        err.print(
            f"keel: {extras.out.failure}; the rest of the output was dropped; run "
            f"{result.run_id} ended {result.status}: {opening}",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
    if not extras.quiet:
        err.print(
            f"{summary}\nopen it with: {opening}", highlight=False, markup=False, soft_wrap=True
        )
    raise typer.Exit(EXIT_CODES[result.status])


def print_result(
    result: RunResult, as_json: bool, out: Stdout, *, answer_shown: bool = False
) -> None:
    """`answer_shown`: the answer was printed as it was written (a terminal)."""
    from keel.present.timeline import json_text
    from keel.pricing import cost_text

    if as_json:
        out.line(json_text(result.to_dict()))
        return
    if result.answer is not None and not answer_shown:
        out.line(safe_text(result.answer))
    if result.sources:  # the pages the provider marked the answer as citing (ADR 0067)
        out.line("Sources:")
        for n, source in enumerate(result.sources, 1):
            out.line(safe_text(f"[{n}] {source.get('title') or '(untitled)'}: {source['url']}"))
    status: str = result.status
    if result.synthesized:
        status += f" (synthesized: {result.synthesized})"
    if result.cut_off:
        status += " (the answer was cut off at the model's output limit or by its timeout)"
    if result.partial:
        gaps = "; ".join(result.gaps) or "none named"
        status += f" (partial structured answer; gaps: {gaps})"
    if result.failure:
        status += f": {result.failure.kind}: {result.failure.message}"
    for pending in result.pending_approvals:
        call = "\n  ".join(describe_call(pending.name, pending.arguments))
        note = f"\n  note: {pending.note}" if pending.note else ""
        err.print(
            f"awaiting approval: {pending.call_id} {call}{note}\n"
            f"  keel approve {result.run_id} {pending.call_id}   or   "
            f"keel deny {result.run_id} {pending.call_id} --reason TEXT",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
    err.print(
        f"{safe_text(status)} · run {result.run_id} · {result.model_calls} model calls · "
        f"{result.tool_calls} tool calls · {result.usage.input_tokens}+"
        f"{result.usage.output_tokens} tokens{' (estimated)' if result.usage.estimated else ''}"
        f" · {cost_text(result.cost)}",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )
