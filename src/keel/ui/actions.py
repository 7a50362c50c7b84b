"""Acting on a paused run from the web view: record a decision, then resume the run.

The decision is recorded through `approvals` on a writable `Store` opened for that one request
(the pages read through a read-only one), exactly as `keel approve`/`keel deny` record it. Once
no pending call is left undecided, the run is resumed in the background by `keel resume RUN
--store PATH`, a process of its own: it outlives a closed browser tab or a stopped `keel ui`,
takes the run's lease like any other resume (a second resume is refused, never run twice), and
rebuilds the run's tools from its stored settings. What that process says when it cannot
resume the run (exit code 2) is kept and shown on the run's page.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable

from keel import approvals
from keel.store import Store
from keel.ui.text import clean

__all__ = ["Resumer", "decide"]

MAX_BY = 100
MAX_REASON = 2_000


def decide(
    store_path: str, run_id: str, call_id: str, *, approve: bool, by: str, reason: str | None
) -> bool:
    """Record one decision; True when the run has no undecided call left (resume it now).

    Raises ConfigError (from the store) when the call is not pending."""
    store = Store(store_path)
    try:
        who = clean(by).strip()[:MAX_BY] or approvals.who()
        if approve:
            approvals.approve(store, run_id, call_id, by=who)
        else:
            approvals.deny(store, run_id, call_id, clean(reason or "")[:MAX_REASON], by=who)
        return not approvals.pending(store, run_id)
    finally:
        store.close()


class Resumer:
    """Starts `keel resume` processes and remembers what a failed one said, per run."""

    def __init__(self, store_path: str, command: Callable[[str, str], list[str]] | None = None):
        self.store_path = store_path
        self.command = command or _keel_resume
        self.notes: dict[str, str] = {}
        self._lock = threading.Lock()

    def __call__(self, run_id: str) -> None:
        with self._lock:
            self.notes.pop(run_id, None)
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
            with self._lock:
                self.notes[run_id] = f"resuming this run failed: {said}"

    def note(self, run_id: str) -> str | None:
        with self._lock:
            return self.notes.get(run_id)


def _keel_resume(run_id: str, store_path: str) -> list[str]:
    return [sys.executable, "-m", "keel", "resume", run_id, "--store", store_path, "--json"]
