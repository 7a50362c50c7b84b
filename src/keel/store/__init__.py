"""The run store: SQLite in WAL mode behind a narrow API (see `sqlite_store`)."""

from keel.errors import LeaseHeld, LeaseLost
from keel.store.sqlite_store import (
    Checkpoint,
    RunRecord,
    Store,
    new_lease_owner,
)

__all__ = [
    "Checkpoint",
    "LeaseHeld",
    "LeaseLost",
    "RunRecord",
    "Store",
    "new_lease_owner",
]
