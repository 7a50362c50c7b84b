"""Every Python block of the README runs as written (issue 26: the snippets were fragments,
`NameError: name 'keel' is not defined`, `'async with' outside async function`).

Blocks are taken in order. One whose first line is a file name comment (``# glossary_server.py``)
is a file the later blocks use: it is written into the working folder. Every other block runs as
a script of its own in a fresh interpreter, in a throwaway folder, with the default store under
a throwaway data folder; it must exit 0. A block that needs a provider's key would be marked
``# needs: OPENAI_API_KEY`` and skipped with that reason (none is, today).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
FILE_NAME = re.compile(r"# ([\w.-]+\.py)\n")
NEEDS = re.compile(r"# needs: (\w+)")


def readme_blocks() -> list[str]:
    return BLOCK.findall((ROOT / "README.md").read_text())


def test_the_readme_has_python_blocks_to_run() -> None:
    assert len(readme_blocks()) >= 4


@pytest.mark.parametrize("index", range(len(readme_blocks())))
def test_every_readme_python_block_runs_as_written(index: int, tmp_path: Path) -> None:
    blocks = readme_blocks()
    block = blocks[index]
    if FILE_NAME.match(block):
        compile(block, "README block", "exec")  # a file the others use: valid Python
        return
    needs = NEEDS.search(block)
    if needs and not os.environ.get(needs.group(1)):
        pytest.skip(f"README block {index} needs {needs.group(1)}")
    for earlier in blocks[:index]:
        named = FILE_NAME.match(earlier)
        if named:
            (tmp_path / named.group(1)).write_text(earlier)
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "XDG_DATA_HOME": str(tmp_path / "data"),
        "KEEL_STORE": "",
    }
    done = subprocess.run(
        [sys.executable, "-c", block],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"README block {index}:\n{block}\nstderr:\n{done.stderr}"
