"""`keel trust`'s words: what trusting a folder's keel.toml grants, key by key (ADR 0062).

Trust grants the file's model, base_url and ordinary settings; each key of `keel.config.RISKY`
is granted only by name (`--grant KEY`, or a yes to its own question on a terminal), and the
command says which were not and how to grant them.
"""

from __future__ import annotations

import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import typer

from keel.config import RISKY
from keel.present.terminal import safe_text

__all__ = ["ask_each", "keys_of", "lines"]

_PLAIN = {
    "model": "the model keel run uses",
    "base_url": "the server keel run sends your prompts to",
}


def keys_of(path: Path) -> dict[str, object]:
    """The file's top-level keys and values (trust has read it already)."""
    return tomllib.loads(path.read_text(encoding="utf-8"))


def ask_each(data: dict[str, object], given: list[str]) -> list[str]:
    """The risky keys granted: those named, and on a terminal each other one the file sets,
    asked about on its own (no by default)."""
    chosen = list(dict.fromkeys(given))
    if not sys.stdin.isatty():
        return chosen
    for key in RISKY:
        if key in data and key not in chosen:
            question = f"{key} = {safe_text(repr(data[key]))} {RISKY[key]}. Grant it?"
            if typer.confirm(question, default=False):
                chosen.append(key)
    return chosen


def lines(path: Path, data: dict[str, object], chosen: list[str]) -> Iterator[str]:
    """What was trusted: the file, each key with what it does, and the risky keys not
    granted with how to grant each."""
    yield f"trusted {path}"
    for key, value in data.items():
        shown = safe_text(f"{key} = {value!r}")[:200]
        if key in RISKY and key not in chosen:
            yield f"  not granted: {shown} ({RISKY[key]}); grant it with --grant {key}"
        elif key in RISKY:
            yield f"  granted: {shown} ({RISKY[key]})"
        else:
            yield f"  {shown}" + (f" ({_PLAIN[key]})" if key in _PLAIN else "")
