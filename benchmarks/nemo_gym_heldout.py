"""Gather the held-out recordings of ADR 0064's second measurement from a NeMo Gym wheel.

NeMo Gym (NVIDIA, Apache-2.0) ships example rollouts of its environments inside its wheel: each
line a real rollout of a model through the environment's tools (`response.output`, OpenAI
Responses items) with the environment's verdict (`reward`, and `resolved` for the SWE agents).
This script selects them by content, never by what the tiers would do with them:

- every line of every `.jsonl` file in the wheel that is a JSON object whose `response.output`
  list holds at least one `function_call` (a run with no tool call cannot be cut);
- each distinct run once (the same `output` items in another file, as the wheel's copies under
  `environments/` and `resources_servers/` are, count once: the first in path order);
- none from the file `tests/data/recordings/` keeps for the reader's test (it comes from
  another version of the wheel, 0.4.0, and none of its runs is in 0.7.0: checked here).

The lines are written as they are, in path order, to one JSON lines file for `keel replay
--format nemo-gym`; the verdicts are counted as the reader takes them. Usage (the wheel from
PyPI, `pip download --no-deps --only-binary :all: --python-version 3.13.14 nemo-gym==0.7.0`):

    PYTHONPATH=src python benchmarks/nemo_gym_heldout.py nemo_gym-0.7.0-py3-none-any.whl OUT.jsonl
"""

from __future__ import annotations

import hashlib
import json
import sys
import zipfile
from pathlib import Path

from keel.replay.nemo_gym import verdict


def rollout_output(line: str) -> list[object] | None:
    """The run's `response.output` items when the line is a rollout with a tool call."""
    try:
        data = json.loads(line)
    except ValueError:
        return None
    response = data.get("response") if isinstance(data, dict) else None
    output = response.get("output") if isinstance(response, dict) else None
    if not isinstance(output, list):
        return None
    calls = [i for i in output if isinstance(i, dict) and i.get("type") == "function_call"]
    return output if calls else None


def resolved(line: str) -> bool | None:
    """The verdict as `keel replay` takes it (`keel.replay.nemo_gym.verdict`)."""
    return verdict(json.loads(line))


def gather(wheel: Path, excluded: set[str]) -> list[tuple[str, int, str]]:
    """(path in the wheel, line number, line) of each distinct run, in path order."""
    seen: set[str] = set(excluded)
    runs = []
    with zipfile.ZipFile(wheel) as archive:
        for name in sorted(n for n in archive.namelist() if n.endswith(".jsonl")):
            text = archive.read(name).decode("utf-8", "replace")
            for number, line in enumerate(text.splitlines(), start=1):
                output = rollout_output(line)
                if output is None:
                    continue
                key = hashlib.sha256(json.dumps(output, sort_keys=True).encode()).hexdigest()
                if key in seen:
                    continue
                seen.add(key)
                runs.append((name, number, line))
    return runs


def test_file_keys() -> set[str]:
    """The runs of the reader's test file, so none of them enters the held-out set."""
    path = Path(__file__).parent.parent / "tests/data/recordings/nemo-gym-opencode-math.jsonl"
    keys = set()
    for line in path.read_text().splitlines():
        output = rollout_output(line)
        if output is not None:
            keys.add(hashlib.sha256(json.dumps(output, sort_keys=True).encode()).hexdigest())
    return keys


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__)
        return 2
    wheel, out = Path(argv[1]), Path(argv[2])
    excluded = test_file_keys()
    runs = gather(wheel, excluded)
    with out.open("w") as handle:
        for _, _, line in runs:
            handle.write(line + "\n")
    verdicts = [resolved(line) for _, _, line in runs]
    files = sorted({name for name, _, _ in runs})
    print(f"wheel sha256 {hashlib.sha256(wheel.read_bytes()).hexdigest()}")
    print(f"{len(runs)} runs from {len(files)} files, {len(excluded)} test-file runs left out")
    print(
        f"resolved {verdicts.count(True)}, not resolved {verdicts.count(False)}, "
        f"not judged {verdicts.count(None)}"
    )
    for name in files:
        print(f"  {name}: {sum(1 for n, _, _ in runs if n == name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
