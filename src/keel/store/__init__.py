"""Run stores behind one Protocol (`protocol.RunStore`): SQLite, the embedded default
(`sqlite_store`), and Postgres for many machines (`postgres_store`, imported only when a
`postgresql://` store is named). `open_store` picks one from a path or a URL."""

from keel.errors import LeaseHeld, LeaseLost
from keel.store.locate import open_store, store_target
from keel.store.protocol import Checkpoint, RunRecord, RunStore, new_lease_owner
from keel.store.sqlite_store import Store

__all__ = [
    "Checkpoint",
    "LeaseHeld",
    "LeaseLost",
    "RunRecord",
    "RunStore",
    "Store",
    "new_lease_owner",
    "open_store",
    "store_target",
]
