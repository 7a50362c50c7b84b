"""Every Python block of the README and of its `docs/` pages runs as written (issue 26: the
snippets were fragments, `NameError: name 'keel' is not defined`, `'async with' outside async
function`; issue 31 moved most of them from the README into the pages).

Blocks are taken in order, document by document. One whose first line is a file name comment
(``# glossary_server.py``) is a file the later blocks of its document use: it is written into
the working folder. Every other block runs as a script of its own in a fresh interpreter, in a
throwaway folder, with the default store under a throwaway data folder; it must exit 0. A block
that needs a provider's key is marked ``# needs: OPENAI_API_KEY`` and skipped with that reason
(the structured-output example of `docs/answers.md` is).
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


DOCUMENTS = ["README.md", *(f"docs/{page.name}" for page in sorted((ROOT / "docs").glob("*.md")))]


def readme_blocks(document: str = "README.md") -> list[str]:
    return BLOCK.findall((ROOT / document).read_text())


def every_block() -> list[tuple[str, int]]:
    return [(doc, index) for doc in DOCUMENTS for index in range(len(readme_blocks(doc)))]


def test_the_readme_has_python_blocks_to_run() -> None:
    assert len(every_block()) >= 4
    assert readme_blocks(), "the README itself shows the library"


@pytest.mark.parametrize(("document", "index"), every_block(), ids=lambda v: str(v))
def test_every_readme_python_block_runs_as_written(
    document: str, index: int, tmp_path: Path
) -> None:
    blocks = readme_blocks(document)
    block = blocks[index]
    if FILE_NAME.match(block):
        compile(block, f"{document} block", "exec")  # a file the others use: valid Python
        return
    needs = NEEDS.search(block)
    if needs and not os.environ.get(needs.group(1)):
        pytest.skip(f"{document} block {index} needs {needs.group(1)}")
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
    assert done.returncode == 0, f"{document} block {index}:\n{block}\nstderr:\n{done.stderr}"
