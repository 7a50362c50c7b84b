"""Named crash points for the kill tests: prove that a run survives dying anywhere.

`KEEL_FAILPOINTS="after_model_response:3"` makes the process SIGKILL itself the 3rd time it
passes that point (several points: comma-separated). Unset, a failpoint costs one dict lookup.
This is how the crash-safety tests reach exact places (inside a side-effecting call, between
a step's journal and its checkpoint) that an outside kill could only hit by luck.
"""

from __future__ import annotations

import os
import signal

__all__ = [
    "ENV",
    "failpoint",
]

ENV = "KEEL_FAILPOINTS"


def _parse(spec: str) -> dict[str, int]:
    points: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, count = part.partition(":")
        points[name] = int(count or "1")
    return points


_armed = _parse(os.environ.get(ENV, ""))


def failpoint(name: str) -> None:
    """Die here, without cleanup, if this point is armed and its count has come."""
    if not _armed or name not in _armed:
        return
    _armed[name] -= 1
    if _armed[name] <= 0:
        os.kill(os.getpid(), signal.SIGKILL)
