"""Acting on a paused run from the web view: record a decision, then resume the run.

The decision is recorded through `approvals` on a writable store opened for that one request
(the pages read through a read-only one), exactly as `keel approve`/`keel deny` record it. Once
no pending call is left undecided, the run goes on in the background:

- on a SQLite file, `keel resume RUN --store PATH` (`Resumer`), a process of its own: it
  outlives a closed browser tab or a stopped `keel ui`, takes the run's lease like any other
  resume (a second resume is refused, never run twice), and rebuilds the run's tools from its
  stored settings. What it says when it cannot resume the run (exit code 2) is shown on the
  run's page;
- on Postgres, the run is queued for the workers (`Enqueuer`), as `keel approve` queues it
  (`Dispatch.hand_on_decided`): a `keel worker` continues it, on whichever machine. Nothing
  runs in `keel ui`'s process, and the URL (with its password) is never put on a command line.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from keel import approvals
from keel.errors import ConfigError, KeelError
from keel.records import Decision
from keel.store import open_store
from keel.store.locate import is_url
from keel.ui.text import clean

__all__ = ["Enqueuer", "Resumer", "decide", "edited_arguments", "going_on"]

MAX_BY = 100
MAX_REASON = 2_000
MAX_ANSWER = 8_000


def decide(
    target: str | Path,
    run_id: str,
    call_id: str,
    *,
    approve: bool,
    by: str,
    reason: str | None,
    arguments: Any = None,
    for_run: bool = False,
    answer: str | None = None,
    call_key: str | None = None,
) -> bool:
    """Record one decision; True when the run has no undecided call left (resume it now).

    The four decisions of ADR 0052: approve (with `arguments` edited, checked against the
    schema recorded with the call; `for_run`: its tool's later calls too), deny with a reason,
    or `answer` in place of the tool. `call_key`: the key of the call the form showed, so a
    decision is never taken for another call. Raises AlreadyDecided when someone decided the
    call first (decisions are final), DecisionExpired past its expiry, and ConfigError when it
    is not pending, the key differs, or the edited arguments do not fit."""
    store = open_store(target)
    try:
        who = clean(by).strip()[:MAX_BY] or approvals.who()
        if answer is not None:
            if not answer.strip():
                raise ConfigError("the answer is empty: say what the call's result should be")
            decision = Decision(False, who, answer=clean(answer)[:MAX_ANSWER])
        elif approve:
            asked = {p.call_id: p.arguments for p in approvals.pending(store, run_id)}
            if call_id in asked and arguments == asked[call_id]:
                arguments = None  # left as shown: approved as asked, not "edited"
            decision = Decision(True, who, arguments=arguments, for_run=for_run)
        else:
            decision = Decision(False, who, clean(reason or "")[:MAX_REASON])
        approvals.decide(store, run_id, call_id, decision, expect_key=call_key)
        return not approvals.pending(store, run_id)
    finally:
        store.close()


def edited_arguments(written: str) -> Any:
    """The arguments a person wrote in the form, as JSON; None when blank. Raises ValueError
    naming what is wrong with the JSON."""
    if not written.strip():
        return None
    try:
        return json.loads(written)
    except ValueError as exc:
        raise ValueError(f"the edited arguments are not JSON: {exc}") from None
    except RecursionError:  # deeper than the decoder goes: no call's arguments are
        raise ValueError(
            "the edited arguments are nested too deep: a call's arguments nest at most 64 levels"
        ) from None


def going_on(target: str | Path) -> Resumer | Enqueuer:
    """What continues a run once it is decided: a `keel resume` here, or the workers."""
    return Enqueuer(str(target)) if is_url(target) else Resumer(str(target))


class _Notes:
    """What went wrong when a run was to go on, per run, for its page."""

    then = ""
    """What a decided call's line says happens next (true once the call returns)."""

    def __init__(self) -> None:
        self.notes: dict[str, str] = {}
        self._lock = threading.Lock()

    def note(self, run_id: str) -> str | None:
        with self._lock:
            return self.notes.get(run_id)

    def _set(self, run_id: str, note: str | None) -> None:
        with self._lock:
            if note is None:
                self.notes.pop(run_id, None)
            else:
                self.notes[run_id] = note


class Enqueuer(_Notes):
    """Queues decided runs of a Postgres store for the workers (blocking: call it off the
    event loop), and notes when that could not be done."""

    then = "queued for a keel worker"

    def __init__(self, url: str) -> None:
        super().__init__()
        self.url = url

    def __call__(self, run_id: str) -> None:
        from keel.pool.dispatch import hand_on_decided

        try:
            decided = hand_on_decided(self.url, run_id)
        except KeelError as exc:  # one line, the password left out (pg_connection)
            self._set(run_id, f"queuing this run for the workers failed: {exc}")
            return
        if decided.waiting or decided.queued:
            self._set(run_id, None)
        else:
            self._set(
                run_id,
                "the decision is recorded, but no keel worker has set the queue up on this "
                f"store yet: the first keel worker to start takes it (or `keel resume {run_id}`)",
            )


class Resumer(_Notes):
    """Starts `keel resume` processes and remembers what a failed one said, per run."""

    then = "resuming…"

    def __init__(self, store_path: str, command: Callable[[str, str], list[str]] | None = None):
        super().__init__()
        self.store_path = store_path
        self.command = command or _keel_resume

    def __call__(self, run_id: str) -> None:
        self._set(run_id, None)
        process = subprocess.Popen(
            self.command(run_id, self.store_path),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,  # Ctrl-C on `keel ui` does not cancel the resumed run
        )
        threading.Thread(
            target=self._wait, args=(run_id, process), name="keel-ui-resume", daemon=True
        ).start()

    def _wait(self, run_id: str, process: subprocess.Popen[bytes]) -> None:
        _, err = process.communicate()
        if process.returncode == 2:  # usage or configuration: the run did not move
            said = err.decode("utf-8", "replace").strip()[-2_000:]
            self._set(run_id, f"resuming this run failed: {said}")


def _keel_resume(run_id: str, store_path: str) -> list[str]:
    return [sys.executable, "-m", "keel", "resume", run_id, "--store", store_path, "--json"]
