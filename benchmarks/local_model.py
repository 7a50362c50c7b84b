"""The embedded local model: assembling it, loading it, and what Keel adds to a generation.

What is measured
  1. Assembling. `ensure_model` into an empty temporary cache folder (join the six parts while
     hashing, fsync, rename), then again on the same folder (the sidecar check alone).
  2. Loading. ``llama_cpp.Llama(path, chat_format="chatml", ...)`` as Keel builds it, median of
     a few loads (the file is in the page cache after the first; the first is shown apart).
  3. Generation, direct vs Keel. The same fixed prompt (a system text and one question),
     ``max_tokens`` (default 128), temperature 0, seed 0 and the same stop sequences, through
       direct = ``Llama.create_chat_completion(messages, ...)`` called in the benchmark's thread;
       keel   = ``XmlFallbackTransport(LocalTransport(...)).request(ModelRequest(...))`` awaited
                on an event loop (mapping both ways, the worker thread, the lock, the cancel
                hook, the XML parse).
     Both sides drive the same ``Llama`` object (the one Keel loaded), after one warm-up call
     each, so both run with the prompt already in llama.cpp's prefix cache, as every turn after
     the first does in a run: the time is the generation. Repeats alternate the order (direct
     first, then keel first, ...). The table shows each side's median time and tokens/s; the
     ratio keel/direct is given of the medians and as the median of the per-repeat ratios
     (each pair runs back to back, so that figure is the least disturbed by drifting machine
     load). Both sides must produce the same text and token count (greedy decoding). Keel's
     own time is also measured directly: each Keel request's time minus the time spent inside
     ``create_chat_completion`` (the per-token cancel hook runs inside that call; it costs
     about 25 microseconds a token).

Target: the median paired keel/direct ratio <= 1.03. PASS/FAIL is printed; the exit status is
1 on FAIL only with `--check`. Timings depend on the machine and its other load: compare
figures from the same machine, and prefer a quiet one (the load average is printed before and
after).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

try:
    import keel  # noqa: F401
except ModuleNotFoundError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from rich.console import Console
from rich.table import Table

from keel.local_model import QWEN25_CODER_05B, ensure_model
from keel.messages import ModelRequest, UserMessage
from keel.transports.local import DEFAULT_STOP, LocalTransport, to_messages
from keel.transports.xml_fallback import XmlFallbackTransport

SYSTEM = "You are a careful senior Python engineer. Answer precisely."
PROMPT = (
    "Write a Python function that parses an ISO 8601 date string such as 2024-03-15 into a "
    "datetime.date without using datetime.fromisoformat, validating the month and the day, "
    "and explain each step of it."
)
TARGET_RATIO = 1.03
N_CTX = 2048

console = Console(width=None if sys.stdout.isatty() else 120)


def seconds(fn: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    value = fn()
    return time.perf_counter() - started, value


def bench_assembly() -> tuple[float, float]:
    with tempfile.TemporaryDirectory(prefix="keel-bench-") as folder:
        join, _ = seconds(lambda: ensure_model(QWEN25_CODER_05B, Path(folder)))
        check, _ = seconds(lambda: ensure_model(QWEN25_CODER_05B, Path(folder)))
    return join, check


def load(path: Path) -> Any:
    import llama_cpp

    return llama_cpp.Llama(
        model_path=str(path),
        chat_format="chatml",
        n_ctx=N_CTX,
        n_threads=os.cpu_count(),
        logits_all=False,
        verbose=False,
    )


def bench_load(path: Path, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        elapsed, llama = seconds(lambda: load(path))
        llama.close()
        times.append(elapsed)
    return times


async def bench_generation(path: Path, repeats: int, max_tokens: int) -> dict[str, Any]:
    request = ModelRequest(SYSTEM, (), (UserMessage(PROMPT),))
    messages = to_messages(request)  # what Keel sends: the same two messages
    local = LocalTransport(
        model_path=str(path), n_ctx=N_CTX, max_tokens=max_tokens, temperature=0.0, seed=0
    )
    keel_transport = XmlFallbackTransport(local)
    local.prepare()
    inner: list[float] = []  # time spent inside llama.cpp during each Keel request
    real_call = local._llama.create_chat_completion  # benchmark-only peek at the shell

    def timed_call(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return real_call(*args, **kwargs)
        finally:
            inner.append(time.perf_counter() - started)

    local._llama.create_chat_completion = timed_call

    def direct() -> Any:  # the very same Llama object, called without Keel around it
        return real_call(
            messages, max_tokens=max_tokens, temperature=0.0, seed=0, stop=list(DEFAULT_STOP)
        )

    async def through_keel() -> tuple[float, Any]:
        started = time.perf_counter()
        response = await keel_transport.request(request)
        return time.perf_counter() - started, response

    direct()  # warm-up: both sides start with the prompt in their prefix cache
    await through_keel()
    inner.clear()
    runs: dict[str, list[float]] = {"direct": [], "keel": []}
    tokens: dict[str, set[int]] = {"direct": set(), "keel": set()}
    texts: dict[str, set[str]] = {"direct": set(), "keel": set()}
    for repeat in range(repeats):
        for side in ("direct", "keel") if repeat % 2 == 0 else ("keel", "direct"):
            if side == "direct":
                elapsed, data = seconds(direct)
                tokens[side].add(data["usage"]["completion_tokens"])
                texts[side].add(data["choices"][0]["message"]["content"])
            else:
                elapsed, response = await through_keel()
                tokens[side].add(response.usage.output_tokens)
                texts[side].add(response.text or "")
            runs[side].append(elapsed)
    local.close()
    own = [total - llama for total, llama in zip(runs["keel"], inner, strict=True)]
    return {
        "runs": runs,
        "tokens": tokens,
        "same_text": texts["direct"] == texts["keel"],
        "own": own,
    }


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


async def main(args: argparse.Namespace) -> int:
    console.print(f"CPUs: {os.cpu_count()}  load average before: {load_average()}")
    path = ensure_model(QWEN25_CODER_05B)
    setup = Table(title="Assembling and loading Qwen2.5-Coder-0.5B-Instruct Q4_K_M")
    setup.add_column("step")
    setup.add_column("seconds", justify="right")
    if not args.skip_join:
        join, check = bench_assembly()
        setup.add_row("join 6 parts (491 MB) + sha256 + fsync + rename", f"{join:.2f}")
        setup.add_row("reuse a verified file (sidecar check)", f"{check * 1000:.2f} ms")
    loads = bench_load(path, args.loads)
    setup.add_row("load, first", f"{loads[0]:.2f}")
    if len(loads) > 1:
        setup.add_row(
            f"load, median of the next {len(loads) - 1}", f"{statistics.median(loads[1:]):.2f}"
        )
    console.print(setup)

    result = await bench_generation(path, args.repeats, args.max_tokens)
    runs, tokens = result["runs"], result["tokens"]
    table = Table(title=f"Generation: {args.max_tokens} tokens max, median of {args.repeats}")
    for column in ("path", "median s", "min s", "max s", "tokens", "tokens/s"):
        table.add_column(column, justify="left" if column == "path" else "right")
    for side in ("direct", "keel"):
        median = statistics.median(runs[side])
        count = max(tokens[side])
        table.add_row(
            "llama.cpp create_chat_completion" if side == "direct" else "Keel xml:local request",
            f"{median:.3f}", f"{min(runs[side]):.3f}", f"{max(runs[side]):.3f}",
            "/".join(str(t) for t in sorted(tokens[side])), f"{count / median:.1f}",
        )  # fmt: skip
    console.print(table)
    ratio = statistics.median(runs["keel"]) / statistics.median(runs["direct"])
    paired = statistics.median(k / d for k, d in zip(runs["keel"], runs["direct"], strict=True))
    own = result["own"]
    ok = paired <= TARGET_RATIO
    console.print(
        f"keel/direct, ratio of medians: {ratio:.3f}   median of paired ratios: {paired:.3f}"
    )
    console.print(
        f"Keel's own time per request (outside create_chat_completion): median "
        f"{statistics.median(own) * 1000:.2f} ms, max {max(own) * 1000:.2f} ms "
        f"({statistics.median(own) / statistics.median(runs['direct']) * 100:.3f}% of a generation)"
    )
    same = result["same_text"] and tokens["direct"] == tokens["keel"]
    console.print(f"same text and token count on both paths: {same}")
    console.print(f"load average after: {load_average()}")
    console.print(f"Target keel/direct <= {TARGET_RATIO}: {'PASS' if ok else 'FAIL'}")
    return 1 if args.check and not ok else 0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=7, help="generation repeats per side")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--loads", type=int, default=4, help="model loads to time")
    parser.add_argument("--skip-join", action="store_true", help="do not time a fresh join")
    parser.add_argument("--check", action="store_true", help="exit 1 when the target is missed")
    return parser.parse_args()


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
