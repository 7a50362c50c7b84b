"""``--model script:FILE`` reads a bounded, regular file (tracker issue 9).

``script:/dev/zero`` once read until the machine ran out of memory, and a FIFO would block the
run for ever. A script must be a regular file no larger than `MAX_SCRIPT_BYTES`; anything else is
refused with a ConfigError that names the limit. The checks that could eat memory or hang on
the old code run in a child process with a memory limit and a timeout.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from keel.errors import ConfigError
from keel.transports.scripted import ScriptedTransport

MEMORY_LIMIT = 1 << 30
"""Address space for the child: enough for Python and pydantic, far below the machine's."""

CHILD = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))
from keel.errors import ConfigError
from keel.transports.scripted import ScriptedTransport
try:
    ScriptedTransport.from_file(sys.argv[1])
except ConfigError as exc:
    print("ConfigError:", exc)
else:
    print("loaded")
"""


def load_in_a_child(path: str) -> str:
    """What loading `path` as a script prints, in a child with a memory limit and a timeout."""
    code = CHILD.format(limit=MEMORY_LIMIT)
    try:
        done = subprocess.run(
            [sys.executable, "-c", code, path], capture_output=True, text=True, timeout=30
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"loading {path} as a script did not return within 30 s")
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
def test_a_device_is_refused_without_reading_it() -> None:
    output = load_in_a_child("/dev/zero")
    assert output.startswith("ConfigError: script /dev/zero: not a regular file")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "script.fifo"
    os.mkfifo(fifo)
    output = load_in_a_child(str(fifo))
    assert output.startswith(f"ConfigError: script {fifo}: not a regular file")


def test_a_file_over_the_size_limit_is_refused_naming_the_limit(tmp_path: Path) -> None:
    huge = tmp_path / "huge.json"
    with huge.open("wb") as file:
        file.truncate(16 * 1024 * 1024 + 1)  # sparse: costs no disk
    with pytest.raises(ConfigError) as info:
        ScriptedTransport.from_file(huge)
    assert "larger than the 16 MiB a script may have" in str(info.value)


def test_a_file_at_the_size_limit_is_read(tmp_path: Path) -> None:
    script = b'{"turns": [{"text": "ok"}]}'
    path = tmp_path / "padded.json"
    path.write_bytes(script + b" " * (16 * 1024 * 1024 - len(script)))
    assert ScriptedTransport.from_file(path).remaining == 1
