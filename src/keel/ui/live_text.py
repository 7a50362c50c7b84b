"""The live page's growing answer: the running process's live file (keel/live_file.py), read
and escaped here (ADR 0039).

The text is model output, untrusted: it is cleaned of control characters and escaped before
it is sent, and the page puts it in place as the server rendered it. At most `MAX_BYTES` of it
are read, whatever the file holds. No file (nobody streams, the attempt was discarded, the
answer is recorded): no text, and the page drops what it showed.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

from markupsafe import escape

from keel.live_file import MAX_BYTES, NOFOLLOW, live_dir, live_path, make_live_dir
from keel.ui import text

__all__ = ["LiveTexts", "read"]

HEAD_BYTES = 200
"""The header line is `{"step": S, "attempt": A}`: longer is no live file of Keel's."""
STALE_SECONDS = 120.0
"""A file nothing was written to for this long is a crashed process's: not shown (a crashed
run stays `running` in the store until it is resumed, whose first text starts the file anew)."""


def read(path: Path) -> tuple[int, int, str] | None:
    """The step, attempt and text of a live file; None when there is none to show."""
    try:
        with os.fdopen(os.open(path, os.O_RDONLY | NOFOLLOW), "rb") as handle:
            if time.time() - os.fstat(handle.fileno()).st_mtime > STALE_SECONDS:
                return None
            data = handle.read(HEAD_BYTES + MAX_BYTES)
    except OSError:
        return None
    head, newline, body = data.partition(b"\n")
    if not newline:
        return None  # just made: the header is being written
    try:
        fields = json.loads(head)
        step, attempt = int(fields["step"]), int(fields["attempt"])
    except (ValueError, TypeError, KeyError):
        return None
    return step, attempt, body[:MAX_BYTES].decode("utf-8", errors="ignore")


class LiveTexts:
    """The live files of one SQLite store, as HTML fragments for the live page."""

    def __init__(self, store: Path) -> None:
        self.directory = live_dir(store)
        with contextlib.suppress(OSError):  # a read-only place: no live text, all else works
            make_live_dir(self.directory)

    def close(self) -> None:
        """`keel ui` stops: without the directory, runs started from now on stream nothing
        (it stays while a run writes in it, or while another `keel ui` has made a file)."""
        with contextlib.suppress(OSError):
            self.directory.rmdir()

    def fragment(self, run_id: str) -> str:
        """The answer being written in `run_id`, escaped; "" when none is."""
        found = read(live_path(self.directory, run_id))
        if found is None or not found[2]:
            return ""
        step, attempt, body = found
        return (
            f'<p class="live-text" data-step="{step}" data-attempt="{attempt}">'
            f"{escape(text.clean(body))}</p>"
        )
