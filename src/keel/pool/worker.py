"""`keel worker`: a process that runs queued runs until it is stopped.

Runs arrive as DBOS workflows (`dispatch.py`), at most `concurrency` at once on this worker.
One workflow advances one run as far as it goes:

    take the run's lease (LeaseHeld: another process has it; nothing to do)
    finished, or paused with calls still undecided: let go at once; the queue slot is free
        (a run waiting for a person never holds a slot: the decision queues it again)
    queued: start it; otherwise resume it from its journal (the same rules as `keel resume`:
        an interrupted side effect is answered "effect unknown", never run twice)
    stopped by SIGTERM between two steps: its lease released, it is queued again at once

Keel's journal is the authority, never DBOS's: a workflow has no DBOS steps, so DBOS replaying
one (it runs workflows at least once) only leads back into the lease and the journal. Each
worker has its own executor id, and rescues the runs of dead workers (`Dispatch.rescue`).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from collections.abc import Callable

from keel._run import CHILD_QUEUE, Queued, Resumed
from keel.agent import RunHandle
from keel.assemble import agent_for_record
from keel.errors import ConfigError, KeelError, LeaseHeld, LeaseLost
from keel.pool.children import QueuedChildren
from keel.pool.dispatch import APP, APP_VERSION, QUEUE, WORKFLOW, Dispatch
from keel.result import BUSY, TERMINAL
from keel.store import Checkpoint, new_lease_owner
from keel.store.postgres_store import PostgresStore
from keel.store.protocol import HOST

__all__ = ["PoolWorker"]

_current: PoolWorker | None = None
"""The worker of this process: DBOS calls a module-level workflow, which asks it."""


class PoolWorker:
    def __init__(
        self,
        url: str,
        *,
        concurrency: int = 4,
        name: str | None = None,
        lease_ttl: float = 30.0,
        poll: float = 0.5,
        say: Callable[[str], None] = print,
    ) -> None:
        if concurrency < 1:
            raise ConfigError("--concurrency must be at least 1")
        self.url = url
        self.concurrency = concurrency
        self.name = name or f"{HOST}:{os.getpid()}"
        self.executor_id = f"{self.name}:{uuid.uuid4().hex[:8]}"
        """Unique per process: DBOS tells workers apart by it (and recovers by it)."""
        self.lease_ttl = lease_ttl
        self.poll = poll
        self.say = say
        self.stopping = False
        self.store = PostgresStore(url, connections=min(concurrency, 8) + 2)
        self.dispatch = Dispatch(self.store)
        self.children = QueuedChildren(self.dispatch)
        """Delegations of the runs this worker advances queue their children here."""
        self._active: dict[str, tuple[asyncio.AbstractEventLoop, RunHandle]] = {}
        self._lock = threading.Lock()

    # -- the process -------------------------------------------------------------------------

    def serve(self, stop: threading.Event) -> None:
        """Run until `stop` is set; then stop every run at its next step boundary, let go of
        their leases, queue them again, and return."""
        global _current
        from dbos import DBOS

        _current = self
        _register_workflow()
        DBOS(
            config={
                "name": APP,
                "system_database_url": self.url,
                "executor_id": self.executor_id,
                "application_version": APP_VERSION,
                "log_level": "WARNING",
                "sys_db_pool_size": 8,
            }
        )
        try:
            DBOS.launch()
            DBOS.register_queue(
                QUEUE,
                worker_concurrency=self.concurrency,
                polling_interval_sec=self.poll,
                on_conflict="always_update",
            )
            self.say(
                f"keel worker {self.name}: taking runs from {self.store.path} "
                f"(concurrency {self.concurrency}, executor {self.executor_id})"
            )
            self._rescue(settle=0.0)  # runs submitted before any worker had set the queue up
            while not stop.wait(min(self.lease_ttl / 3, 5.0)):
                self._rescue()
            self._drain()
        finally:
            DBOS.destroy(workflow_completion_timeout_sec=0)
            self.dispatch.close()
            self.store.close()
            _current = None

    def _rescue(self, settle: float = 2.0) -> None:
        try:
            for run_id in self.dispatch.rescue(grace=self.lease_ttl, settle=settle):
                self.say(f"{run_id}: stranded (its worker is gone?); queued again")
            for run_id in self.children.wake_stranded():
                self.say(f"{run_id}: its children have ended; queued again")
        except KeelError as exc:
            self.say(f"could not look for stranded runs: {exc}")

    def _drain(self, timeout: float | None = None) -> None:
        self.stopping = True
        with self._lock:
            active = list(self._active.values())
        self.say(f"keel worker {self.name}: stopping; {len(active)} runs finish their step")
        for loop, handle in active:
            loop.call_soon_threadsafe(handle.stop)
        deadline = time.monotonic() + (timeout or self.lease_ttl * 2)
        while self._active and time.monotonic() < deadline:
            time.sleep(0.05)

    # -- one run -----------------------------------------------------------------------------

    async def advance(self, run_id: str) -> str:
        """Advance one run as far as it goes (see the module docstring); its end, in a word."""
        if self.stopping:
            self.dispatch.hand_on(run_id)
            return "handed on"
        owner = new_lease_owner()
        try:
            await self.store.acquire_lease(run_id, owner, self.lease_ttl)
        except (LeaseHeld, ConfigError) as exc:
            return f"skipped: {exc}"
        record = self.store.get_run(run_id)
        if record is None:
            return "skipped: no such run"
        undecided = [p for p in record.state.pending if p.call_id not in record.state.decisions]
        idle = record.status == "awaiting_children" or (
            record.status == "awaiting_approval" and undecided
        )
        if record.status in TERMINAL or idle:  # its children or a person end the wait
            checkpoint = Checkpoint(run_id, record.state, lease=owner, release=True)
            await self.store.save_step(checkpoint)
            return record.status
        agent = agent_for_record(record, self.store)
        agent.lease_ttl = self.lease_ttl
        fresh = record.status == "queued" and record.state.next_seq == 0  # else queued again
        mark = CHILD_QUEUE.set(self.children)  # its delegations queue their children
        try:
            opening = Queued(run_id, owner) if fresh else Resumed(run_id, None, owner)
            handle = agent.launch(opening)
        finally:
            CHILD_QUEUE.reset(mark)
        with self._lock:
            self._active[run_id] = (asyncio.get_running_loop(), handle)
        try:
            result = await handle
        except LeaseLost:
            return "lease lost"
        finally:
            with self._lock:
                self._active.pop(run_id, None)
            agent.close()
        if result.status == "running":  # stopped between steps: another worker continues
            self.dispatch.hand_on(run_id)
            self.say(f"{run_id}: stopped after {result.model_calls} model calls; queued again")
            return "handed on"
        self.say(f"{run_id}: {result.status}")
        await asyncio.to_thread(self._wake, run_id, record.config.parent_run, result.status)
        return result.status

    def _wake(self, run_id: str, parent_run: str | None, status: str) -> None:
        """A run that waits for its children may find them all ended already; a child that
        ended (or stopped for a person) may be the last its parent waits for; a cancelled run's
        open children are cancelled too (ADR 0069)."""
        try:
            if status == "cancelled":  # its queued children are cancelled with it
                for child in self.children.cancel_open_children(run_id):
                    self.say(f"{child}: cancelled with its parent {run_id}")
            if status == "awaiting_children" and self.children.wake_parent(run_id):
                self.say(f"{run_id}: its children had ended; queued again")
            ending = parent_run is not None and status not in BUSY
            if ending and self.children.wake_parent(str(parent_run)):
                self.say(f"{parent_run}: its children have ended; queued again")
        except KeelError as exc:  # the rescue's sweep finds the parent later
            self.say(f"could not queue the parent of {run_id} again: {exc}")


_registered = False


def _register_workflow() -> None:
    """Register Keel's one workflow with DBOS, once per process, before DBOS is built."""
    global _registered
    if _registered:
        return
    from dbos import DBOS

    @DBOS.workflow(name=WORKFLOW)
    async def keel_run(run_id: str) -> str:
        worker = _current
        if worker is None:
            raise RuntimeError("no Keel worker in this process")
        return await worker.advance(run_id)

    _registered = True
