"""How durable a committed step is, and where that choice comes from.

    process   the default. A commit is in the operating system's hands when it returns: a
              killed or crashed process loses nothing committed. A power cut or a kernel crash
              may lose the last commits (never corrupt the store). SQLite: WAL, synchronous
              NORMAL, no fsync on the commit path.
    power     each commit that saves a step, a decision or the run's end is on the disk before
              the run goes on (SQLite synchronous FULL for that commit: one fsync): a power cut
              loses nothing committed either. It costs a disk flush per step, 0.2-3 ms on an
              ordinary SSD and nothing measurable on a RAM disk.

The library takes it as `Agent(durability=...)` or `Store(path, durability=...)`; the command
line as `--durability`, else `durability = "..."` in `keel.toml` (the working directory's, then
the user config directory's), else `process`. See ADR 0020.
"""

from __future__ import annotations

from typing import Literal

from keel.errors import ConfigError

__all__ = ["DURABILITY_LEVELS", "Durability", "check_durability"]

Durability = Literal["process", "power"]
DURABILITY_LEVELS: tuple[Durability, ...] = ("process", "power")


def check_durability(value: object, where: str = "durability") -> Durability:
    """`value` as a Durability, or a ConfigError naming where it came from."""
    if value == "process" or value == "power":
        return value
    raise ConfigError(
        f'{where} must be "process" (survives a killed process) or "power" (survives a '
        f"power cut; one fsync per step), not {value!r}"
    )
