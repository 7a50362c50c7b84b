"""`scripts/install_step.py`, the filter `make` runs each install step under (issue 37): the
first `make run` printed a dozen pip `Link requires a different Python` lines, pip's `WARNING:
Location ... is ignored` for every package and four CMake developer warnings, all of which look
like failures, then 74 s of silence while the model's packages installed.

`tests/data/make_first_run.log` is a real first `make test` install on this machine (pip 26.3,
llama-cpp-python 0.3.36 compiled by CMake 3.25, then the dev extras), as make printed it."""

from __future__ import annotations

import importlib.util
import io
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
CAPTURED = Path(__file__).resolve().parent / "data" / "make_first_run.log"


def load() -> ModuleType:
    path = ROOT / "scripts" / "install_step.py"
    spec = importlib.util.spec_from_file_location("install_step", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["install_step"] = module
    spec.loader.exec_module(module)
    return module


step = load()


def shown_of(lines: list[str], every: float = 3.0, pace: float = 0.1) -> list[str]:
    """What the terminal shows of `lines`, read `pace` seconds apart."""
    filtered = step.Lines(every)
    shown = [filtered.feed(line, i * pace) for i, line in enumerate(lines)]
    return [s for s in shown if s is not None]


def test_the_noise_of_a_real_first_install_is_left_out_and_its_steps_shown() -> None:
    lines = CAPTURED.read_text().splitlines()
    assert sum("Link requires a different Python" in line for line in lines) == 12
    assert sum("CMake Warning (dev)" in line for line in lines) == 4
    shown = shown_of(lines)
    joined = "\n".join(shown)
    for noise in ("Link requires", "CMake Warning", "PUBLIC_HEADER", "project developers",
                  "is ignored", "Call Stack", "does not provide the extra"):  # fmt: skip
        assert noise not in joined
    assert "Collecting llama-cpp-python==0.3.36" in joined
    assert "Downloading llama_cpp_python-0.3.36.tar.gz (76.6 MB)" in joined  # a big download
    assert "*** Building project with Ninja..." in joined
    assert any(line.lstrip().startswith("[") and "/83]" in line for line in shown)  # progress
    assert "Successfully installed" in joined
    assert "-- Installing:" not in joined and "-- Detecting" not in joined  # details: log only
    assert len(shown) < len(lines) // 5, shown


def test_progress_is_thinned_and_a_problem_always_shown() -> None:
    lines = [f"  [{i}/83] Building CXX object ggml-{i}.cpp.o" for i in range(1, 84)]
    error = "ggml.c:12:3: error: expected ';' before '}' token"
    lines.insert(40, error)
    shown = shown_of(lines, every=3.0, pace=0.1)  # 8.4 s of lines: three progress lines
    assert [s for s in shown if "error:" in s] == [error]
    assert len([s for s in shown if "Building CXX" in s]) == 3


def test_a_cmake_developer_warning_is_dropped_whole_and_what_follows_it_is_not() -> None:
    block = [
        "  CMake Warning (dev) at CMakeLists.txt:20 (install):",
        "    Target llama has PUBLIC_HEADER files but no PUBLIC_HEADER DESTINATION.",
        "  Call Stack (most recent call first):",
        "    CMakeLists.txt:142 (llama_cpp_python_install_target)",
        "  This warning is for project developers.  Use -Wno-dev to suppress it.",
        "  CMake Error at CMakeLists.txt:7 (message):",
    ]
    assert shown_of(block) == ["  CMake Error at CMakeLists.txt:7 (message):"]


def run(tmp_path: Path, *argv: str) -> tuple[int, str, Path]:
    log = tmp_path / "install.log"
    out = io.StringIO()
    code = step.main(["--log", str(log), "--step", "installing the test", *argv], out)
    return code, out.getvalue(), log


def test_a_step_keeps_every_line_in_the_log_and_prints_its_path(tmp_path: Path) -> None:
    lines = CAPTURED.read_text().splitlines()[:60]
    (tmp_path / "out.txt").write_text("\n".join(lines) + "\n")
    code, out, log = run(tmp_path, "--", sys.executable, "-c",
                         f"print(open({str(tmp_path / 'out.txt')!r}).read(), end='')")  # fmt: skip
    assert code == 0
    assert f"all of pip's and CMake's output: {log}" in out
    kept = log.read_text()
    assert all(line in kept for line in lines)
    assert "Link requires" not in out and "is ignored" not in out
    assert "lines of noise left in the log" in out and "done in" in out


def test_a_failing_step_shows_its_last_lines_and_its_exit_code(tmp_path: Path) -> None:
    code, out, log = run(
        tmp_path, "--tail", "2", "--", sys.executable, "-c",
        "import sys; print('detail one'); print('detail two'); print('the cause'); sys.exit(3)",
    )  # fmt: skip
    assert code == 3
    assert "failed (exit 3)" in out and "  the cause" in out and "detail one" not in out
    assert f"all of its output: {log}" in out


def test_a_silent_step_says_it_still_runs_and_how_far_the_watched_files_are(
    tmp_path: Path,
) -> None:
    parts = tmp_path / "site" / "model_part1"
    parts.mkdir(parents=True)
    (parts / "chunk").write_bytes(b"\0" * 3_000_000)
    started = time.monotonic()
    code, out, _ = run(
        tmp_path, "--quiet-after", "1", "--watch", str(tmp_path / "site" / "model_part*"),
        "--watch-label", "of the model", "--", sys.executable, "-c",
        "import time; print('Installing collected packages: model-part1'); time.sleep(3.5)",
    )  # fmt: skip
    assert code == 0 and time.monotonic() - started < 30
    beats = [line for line in out.splitlines() if "still running" in line]
    assert beats, out
    assert "3 MB of the model in place" in beats[0]
    assert "(last: Installing collected packages: model-part1)" in beats[0]


@pytest.mark.parametrize("argv", [[], ["--"]])
def test_no_command_is_a_usage_error(tmp_path: Path, argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        run(tmp_path, *argv)


def makefile_installs(text: str) -> list[str]:
    """The Makefile's command lines that run pip install, continuations joined."""
    joined = text.replace("\\\n", " ")
    return [line.strip() for line in joined.splitlines() if "pip install" in line]


def test_every_pip_install_of_the_makefile_runs_under_the_step_filter() -> None:
    installs = makefile_installs((ROOT / "Makefile").read_text())
    assert len(installs) == 4  # pip itself, llama-cpp-python, the run and the dev installs
    for line in installs:
        assert "$(STEP) --step" in line, line
    assert "-Wno-dev" in (ROOT / "Makefile").read_text()
