"""One process at a time advances a run: the lease it holds, and the heartbeat that renews it.

Checkpoints renew the lease too; the heartbeat covers long model and tool calls between them. A
heartbeat that finds the lease taken over (this process was presumed dead: paused, suspended,
cut off) stops the run at once with LeaseLost, instead of letting it run on until its next
checkpoint is refused.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from keel.errors import LeaseLost, StoreError
from keel.store import RunStore, new_lease_owner

__all__ = ["Lease"]


class Lease:
    def __init__(
        self, store: RunStore | None, run_id: str, ttl: float, owner: str | None = None
    ) -> None:
        """`owner`: a lease the caller already took (a worker takes it before loading)."""
        self.store = store
        self.run_id = run_id
        self.ttl = ttl
        self.owner: str | None = (owner or new_lease_owner()) if store is not None else None
        self.lost: LeaseLost | None = None

    async def acquire(self) -> None:
        """Take a stored run over, or raise LeaseHeld naming the live holder."""
        if self.store is not None and self.owner is not None:
            await self.store.acquire_lease(self.run_id, self.owner, self.ttl)

    @asynccontextmanager
    async def kept(self) -> AsyncIterator[None]:
        """Renew the lease while the body runs; if it is lost, cancel the body and raise."""
        task = asyncio.current_task()
        if self.store is None or task is None:
            yield
            return
        beat = asyncio.create_task(self._beat(task))
        try:
            yield
        except asyncio.CancelledError:
            if self.lost is None:
                raise
            task.uncancel()
            raise self.lost from None
        finally:
            beat.cancel()
        if self.lost is not None:
            raise self.lost

    async def _beat(self, task: asyncio.Task[object]) -> None:
        assert self.store is not None and self.owner is not None
        while True:
            await asyncio.sleep(self.ttl / 3)
            try:
                await self.store.renew_lease(self.run_id, self.owner, self.ttl)
            except LeaseLost as lost:
                self.lost = lost
                task.cancel()
                return
            except StoreError:
                continue  # a full or broken store: the next checkpoint says so, and stops the run
