"""Runs on many machines: `keel submit` queues a run, `keel worker`s run them (ADR 0026).

DBOS queues (over the same Postgres database as the store) hand runs to workers; Keel's own
journal and leases stay the authority on what a run has done and who advances it.
"""

__all__: list[str] = []
