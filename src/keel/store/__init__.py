"""The run store: SQLite in WAL mode behind a narrow API (see `sqlite_store`)."""

from keel.store.sqlite_store import (
    Checkpoint,
    Event,
    LeaseHeld,
    LeaseLost,
    RunRecord,
    Store,
    new_lease_owner,
)

__all__ = [
    "Checkpoint",
    "Event",
    "LeaseHeld",
    "LeaseLost",
    "RunRecord",
    "Store",
    "new_lease_owner",
]
