"""The embedded local model: assembling it, loading it, and what Keel adds to a generation.

What is measured
  1. Assembling. `ensure_model` into an empty temporary cache folder (join the six parts while
     hashing, fsync, rename), then again on the same folder (the sidecar check alone).
  2. Loading. ``llama_cpp.Llama(path, ...)`` as Keel builds it, median of a few loads (the file
     is in the page cache after the first; the first is shown apart).
  3. Generation, direct vs Keel, tokens per second. The same prompt tokens (Keel's rendering of
     a system text and one question) and the same pinned sampling (`LocalTransport.sampling`),
     through
       direct = ``Llama.create_completion(prompt_tokens, ...)`` in the benchmark's thread;
       keel   = ``LocalTransport.request(ModelRequest(...))`` awaited on an event loop (the
                rendering, tokenising, the worker thread, the lock, Keel's own sampling loop
                with its cancel hook, reading the output).
     Both drive the same ``Llama`` object after one warm-up call each, so both start with the
     prompt in llama.cpp's prefix cache. Repeats alternate the order; the figure is the median
     of the per-pair ratios of tokens/s (each pair runs back to back, the least disturbed by a
     drifting machine load). Once for a plain answer, once for an answer under the synthesis
     grammar (llama-cpp-python's grammar sampler on the direct side, Keel's `GrammarMask`).
  4. Prompt caching: turn 3 of a run after turn 2 (whose prompt holds a ~1,500-token result):
     prompt tokens evaluated, the seconds before the first token, with llama.cpp's prefix
     reuse and without it.

Target: keel/direct tokens/s >= 0.97 for the plain answer. PASS/FAIL is printed; the exit status
is 1 on FAIL only with `--check`. Timings depend on the machine and its other load: compare
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

from keel.messages import (
    AssistantMessage,
    ModelRequest,
    ToolCall,
    ToolDefinition,
    ToolResult,
    UserMessage,
)
from keel.transports.local import LocalTransport
from keel.transports.local.grammar import turn_grammar
from keel.transports.local.qwen_format import render_prompt
from keel.transports.local.weights import QWEN25_CODER_05B, ensure_model

SYSTEM = "You are a careful senior Python engineer. Answer precisely."
PROMPT = (
    "Write a Python function that parses an ISO 8601 date string such as 2024-03-15 into a "
    "datetime.date without using datetime.fromisoformat, validating the month and the day, "
    "and explain each step of it."
)
TARGET_RATIO = 0.97
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


async def bench_generation(
    path: Path, repeats: int, max_tokens: int, synthesis: bool = False
) -> dict[str, Any]:
    """Keel's request vs ``create_completion`` on the same prompt tokens and sampling. With
    `synthesis`, both sample under the same answer-only grammar: llama-cpp-python's grammar
    sampler on the direct side, Keel's `GrammarMask` on the other."""
    import llama_cpp

    tools = (ToolDefinition("read_file", "Read a file.", {"type": "object", "properties": {
        "path": {"type": "string"}}, "required": ["path"]}),) if synthesis else ()  # fmt: skip
    request = ModelRequest(SYSTEM, tools, (UserMessage(PROMPT),), "none" if synthesis else None)
    local = LocalTransport(model_path=str(path), n_ctx=N_CTX, max_tokens=max_tokens)
    local.prepare()
    llama = local._llama  # benchmark-only: the very same Llama object, without Keel around it
    prompt = llama.tokenize(render_prompt(request).encode(), add_bos=False, special=True)
    grammar = turn_grammar(tools, "none") if synthesis else None
    sampling = local.sampling

    def direct() -> Any:
        llama.set_seed(int(sampling["seed"]))
        return llama.create_completion(
            prompt,
            max_tokens=max_tokens,
            temperature=sampling["temperature"],
            top_p=sampling["top_p"],
            top_k=sampling["top_k"],
            min_p=0.0,
            repeat_penalty=sampling["repeat_penalty"],
            grammar=llama_cpp.LlamaGrammar.from_string(grammar, verbose=False) if grammar else None,
        )

    async def through_keel() -> tuple[float, Any]:
        started = time.perf_counter()
        response = await local.request(request)
        return time.perf_counter() - started, response

    direct()  # warm-up: both sides start with the prompt in llama.cpp's prefix cache
    await through_keel()
    runs: dict[str, list[float]] = {"direct": [], "keel": []}
    tokens: dict[str, list[int]] = {"direct": [], "keel": []}
    texts: dict[str, set[str]] = {"direct": set(), "keel": set()}
    for repeat in range(repeats):
        for side in ("direct", "keel") if repeat % 2 == 0 else ("keel", "direct"):
            if side == "direct":
                elapsed, data = seconds(direct)
                tokens[side].append(data["usage"]["completion_tokens"])
                texts[side].add(data["choices"][0]["text"])
            else:
                elapsed, response = await through_keel()
                tokens[side].append(response.usage.output_tokens)
                texts[side].add(response.text or "")
            runs[side].append(elapsed)
    local.close()
    return {"runs": runs, "tokens": tokens, "same_text": texts["direct"] == texts["keel"]}


async def bench_prompt_cache(path: Path) -> list[tuple[str, Any]]:
    """Turn 3 of a run after turn 2: turn 2's prompt holds a call and a ~1,500-token result;
    turn 3 adds a second call and a short result. With llama.cpp's prefix reuse turn 3
    evaluates only what it adds; without, the whole prompt."""
    tool = ToolDefinition("read_file", "Read a file.", {"type": "object", "properties": {
        "path": {"type": "string"}}, "required": ["path"]})  # fmt: skip
    first = ToolCall.from_arguments("local_1", "read_file", {"path": "src/keel/_run/loop.py"})
    second = ToolCall.from_arguments("local_2", "read_file", {"path": "src/keel/_run/step.py"})
    text = (Path(__file__).resolve().parents[1] / "src/keel/_run/loop.py").read_text()[:6000]
    items = (
        UserMessage(PROMPT), AssistantMessage(None, (first,)),
        ToolResult("local_1", "read_file", first.key, text),
    )  # fmt: skip
    turn2 = ModelRequest(SYSTEM, (tool,), items)
    turn3 = ModelRequest(SYSTEM, (tool,), (
        *items, AssistantMessage(None, (second,)),
        ToolResult("local_2", "read_file", second.key, "1: from keel import turns")))  # fmt: skip
    rows = []
    for cache in (True, False):
        local = LocalTransport(model_path=str(path), n_ctx=N_CTX, max_tokens=8, prompt_cache=cache)
        await local.request(turn2)
        await local.request(turn3)
        label = "with prefix reuse" if cache else "without (whole prompt)"
        rows.append((label, local.last_generation))
        local.close()
    return rows


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

    ok = True
    for synthesis in (False, True):
        result = await bench_generation(path, args.repeats, args.max_tokens, synthesis)
        runs, tokens = result["runs"], result["tokens"]
        what = "an answer under the synthesis grammar" if synthesis else "a plain answer"
        table = Table(
            title=f"Generation, {what}: {args.max_tokens} tokens max, {args.repeats} each"
        )
        for column in ("path", "median s", "min s", "max s", "tokens", "tokens/s"):
            table.add_column(column, justify="left" if column == "path" else "right")
        rates = {}
        for side in ("direct", "keel"):
            rates[side] = [n / t for n, t in zip(tokens[side], runs[side], strict=True)]
            table.add_row(
                "llama.cpp create_completion" if side == "direct" else "Keel local request",
                f"{statistics.median(runs[side]):.3f}", f"{min(runs[side]):.3f}",
                f"{max(runs[side]):.3f}", "/".join(str(t) for t in sorted(set(tokens[side]))),
                f"{statistics.median(rates[side]):.1f}",
            )  # fmt: skip
        console.print(table)
        paired = statistics.median(
            k / d for k, d in zip(rates["keel"], rates["direct"], strict=True)
        )
        console.print(f"tokens/s keel/direct, median of paired ratios: {paired:.3f}")
        console.print(f"same text on both paths: {result['same_text']}")
        if not synthesis:
            ok = paired >= TARGET_RATIO
    cache = Table(title="Prompt evaluation on turn 3 (turn 2 plus a call and a short result)")
    for column in ("prompt", "tokens", "evaluated", "seconds", "evaluated tokens/s"):
        cache.add_column(column, justify="left" if column == "prompt" else "right")
    for label, g in await bench_prompt_cache(path):
        evaluated = g.prompt_tokens - g.cached_tokens
        cache.add_row(label, str(g.prompt_tokens), str(evaluated), f"{g.prompt_seconds:.2f}",
                      f"{g.prompt_tokens_per_second:.1f}")  # fmt: skip
    console.print(cache)
    console.print(f"load average after: {load_average()}")
    console.print(f"Target keel/direct tokens/s >= {TARGET_RATIO}: {'PASS' if ok else 'FAIL'}")
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
