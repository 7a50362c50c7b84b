"""What the sub-agent tests write their scripted models with: a read call, a delegation, a
script file, and the repository they read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read(path: str = "a.md", **extra: Any) -> dict[str, Any]:
    return {"name": "read_file", "arguments": {"path": path, **extra}}


def delegate(tool: str, task: str) -> dict[str, Any]:
    return {"name": tool, "arguments": {"task": task}}


def script(folder: Path, name: str, data: dict[str, Any]) -> str:
    """A scripted model in a file, as a model spec (`script:PATH`) a child agent or a worker
    can open."""
    path = folder / f"{name}.json"
    path.write_text(json.dumps(data))
    return f"script:{path}"


def make_repo(tmp_path: Path) -> Path:
    """A folder with one long document, `a.md`, for the file tools."""
    folder = tmp_path / "repo"
    folder.mkdir()
    (folder / "a.md").write_text("\n".join(f"line {n}: alpha" for n in range(1, 400)) + "\n")
    return folder
