"""What tracing and MCP cost: per-step time with OpenTelemetry on vs off, and one MCP tool call
against calling the same function directly.

What is measured
  1. Tracing. Runs of N turns (default 300): a scripted model with zero latency asks for one
     cheap in-process read_only tool per turn (1 KB result, a counter argument so the breaker
     never fires), the event log written to a real SQLite store in a temporary folder, as in
     `overhead.py`. OFF: the SDK is installed but samples nothing, which is what a process
     without an SDK costs (Keel starts no span per step; one non-recording span per run).
     ON: every span recorded (invoke_agent, one chat per model call, one execute_tool per tool
     call) into the SDK's in-memory exporter through a SimpleSpanProcessor. The runs alternate
     OFF/ON so both see the same machine load.
       ms/step = wall time of `agent.arun` / model calls; median over the repeats.
       overhead = ON / OFF - 1. Target (the issue): at most +10% at N=300.
  2. MCP calls. The same function (`lookup`) called (a) directly as Python, (b) as a Keel tool
     (`Tool.invoke`, a daemon-thread hop), (c) through the `mcp` package's own client, in the
     caller's loop, to the test server over stdio, (d) as a Keel MCP tool over stdio (the
     client on Keel's MCP loop thread); then (e) the `mcp` client and (f) a Keel MCP tool over
     streamable HTTP on loopback (a fifth as many calls: they are slow). The ways take turns
     call by call, so all see the same load; median, mean and p95 ms per call after a warm-up.
     Keel's own cost is (d) - (c) and (f) - (e); the rest is the protocol and the server.

     The SDK floor: the same two spans per step (as many attributes, the same processor and
     exporter) made in a bare loop, without Keel: what any caller of the SDK pays.

`--check` exits 1 when the tracing target is missed. Timings depend on the machine and its
load: compare figures from one machine, taken together.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Literal

try:
    import keel
except ModuleNotFoundError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    import keel

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from in_memory_spans import EXPORTER, SWITCH, install

TARGET_OVERHEAD = 0.10
console = Console(width=None if sys.stdout.isatty() else 120)


PROVIDER: TracerProvider | None = None


def install_sdk(processor: Literal["simple", "batch"]) -> None:
    global PROVIDER
    PROVIDER = install(processor)


# -- 1. tracing on vs off ------------------------------------------------------------------------

PAYLOAD = ("Lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 40)[:1024]


@keel.tool(effect="read_only")
async def read_chunk(n: int) -> str:
    """Return chunk number n of the benchmark corpus."""
    # each chunk its own, as a real file's are: the repeat tiers see no loop
    return f"{n:08d}{PAYLOAD[8:]}"


def make_agent(store: keel.Store, turns: int) -> keel.Agent:
    script = {
        "turns": [
            {"tool_calls": [{"name": "read_chunk", "arguments": {"n": i}}]}
            for i in range(turns - 1)
        ]
        + [{"text": "The chunks say lorem ipsum."}]
    }
    transport = keel.ScriptedTransport.from_dict(script, f"bench-{turns}")
    limits = keel.Limits(max_model_calls=turns + 10, max_tool_calls=turns + 10)
    return keel.Agent(transport, tools=[read_chunk], limits=limits, store=store)


async def timed(store: keel.Store, turns: int, traced: bool) -> float:
    agent = make_agent(store, turns)
    SWITCH.on = traced
    EXPORTER.clear()
    gc.collect()
    started = time.perf_counter()
    result = await agent.arun("Benchmark: read the chunks, then answer.")
    elapsed = time.perf_counter() - started
    SWITCH.on = False
    if result.status != "completed" or result.model_calls != turns:
        raise SystemExit(f"benchmark run did not complete plainly: {result}")
    assert PROVIDER is not None
    PROVIDER.force_flush()
    if traced and len(EXPORTER.get_finished_spans()) != 2 * turns:
        raise SystemExit(f"expected {2 * turns} spans, got {len(EXPORTER.get_finished_spans())}")
    return elapsed * 1000 / turns


async def tracing(turns: int, repeats: int) -> tuple[list[float], list[float]]:
    with tempfile.TemporaryDirectory() as folder:
        store = keel.Store(Path(folder) / "bench.sqlite")
        await timed(store, 10, False)
        await timed(store, 10, True)  # warm-up
        off, on = [], []
        for _ in range(repeats):
            off.append(await timed(store, turns, False))
            on.append(await timed(store, turns, True))
        store.close()
    return off, on


def sdk_floor(turns: int, repeats: int) -> float:
    """ms per step the SDK alone costs for what Keel records per step: one chat span (7
    attributes at start, 3 at the end) and one execute_tool span (6 and 6), nothing else."""
    tracer = trace.get_tracer("floor")
    chat_start = {f"a{i}": i for i in range(7)}
    chat_end = {f"b{i}": i for i in range(3)}
    tool_start = {f"c{i}": i for i in range(6)}
    tool_end = {f"d{i}": i for i in range(6)}
    SWITCH.on = True
    best = float("inf")
    for _ in range(repeats):
        EXPORTER.clear()
        started = time.perf_counter()
        for _ in range(turns):
            span = tracer.start_span("chat", attributes=chat_start)
            span.set_attributes(chat_end)
            span.end()
            span = tracer.start_span("execute_tool", attributes=tool_start)
            span.set_attributes(tool_end)
            span.end()
        assert PROVIDER is not None
        PROVIDER.force_flush()
        best = min(best, (time.perf_counter() - started) * 1000 / turns)
    SWITCH.on = False
    EXPORTER.clear()
    return best


# -- 2. MCP calls --------------------------------------------------------------------------------


def glossary_lookup(term: str) -> str:
    """The same function the test server's `lookup` tool runs."""
    glossary = {"lease": "A lease is held by one process at a time and expires if it dies."}
    return glossary.get(term, f"{term}: not in the glossary")


async def alternating(fns: list[Callable[[], Awaitable[Any]]], calls: int) -> list[list[float]]:
    """Time each function `calls` times, taking turns, so all see the same machine load."""
    for fn in fns:
        for _ in range(20):
            await fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(calls):
        for fn, into in zip(fns, times, strict=True):
            started = time.perf_counter()
            await fn()
            into.append((time.perf_counter() - started) * 1000)
    return times


async def mcp_calls(calls: int) -> list[tuple[str, list[float]]]:
    from mcp import Client, StdioServerParameters

    from mcp_support import http_server, stdio_command, stdio_server

    async def direct() -> str:
        return glossary_lookup("lease")

    as_tool = keel.tool(effect="read_only")(glossary_lookup)
    validated = as_tool.validate({"term": "lease"})

    def keel_lookup(mcp: Any) -> Callable[[], Awaitable[str]]:
        lookup = next(t for t in mcp if t.name == "lookup")
        args = lookup.validate({"term": "lease"})
        return lambda: lookup.invoke(args)  # type: ignore[no-any-return]

    with tempfile.TemporaryDirectory() as folder:
        log = Path(folder) / "calls.jsonl"
        argv = stdio_command(log)
        params = StdioServerParameters(command=argv[0], args=argv[1:])
        async with Client(params, cache=None) as raw, keel.mcp_tools(stdio_server(log)) as mcp:
            stdio = await alternating(
                [
                    direct,
                    lambda: as_tool.invoke(validated),
                    lambda: raw.call_tool("lookup", {"term": "lease"}),
                    keel_lookup(mcp),
                ],
                calls,
            )
        with http_server(log) as url:
            async with Client(url, cache=None) as raw, keel.mcp_tools(url) as mcp:
                http = await alternating(
                    [lambda: raw.call_tool("lookup", {"term": "lease"}), keel_lookup(mcp)],
                    max(20, calls // 5),
                )
    labels = [
        "(a) the function, called directly",
        "(b) as a Keel tool (Tool.invoke)",
        "(c) mcp package client, stdio, same loop",
        "(d) Keel MCP tool, stdio",
        "(e) mcp package client, streamable HTTP, same loop",
        "(f) Keel MCP tool, streamable HTTP",
    ]
    return list(zip(labels, [*stdio, *http], strict=True))


# -- report --------------------------------------------------------------------------------------


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--skip-mcp", action="store_true")
    parser.add_argument(
        "--processor",
        choices=("simple", "batch"),
        default="simple",
        help="how spans reach the in-memory exporter: SimpleSpanProcessor (synchronously, in "
        "the run's thread) or BatchSpanProcessor (a queue and a thread, as `keel --otel`)",
    )
    args = parser.parse_args()

    install_sdk(args.processor)
    off, on = await tracing(args.turns, args.repeats)
    table = Table(
        title=f"1. Per-step time at N={args.turns}, tracing OFF vs ON (in-memory exporter, "
        f"{args.processor} processor)"
    )
    for col in ("tracing", "runs", "ms/step (median)", "ms/step (best)", "ms/step (mean)"):
        table.add_column(col, justify="right")
    for label, times in (("off", off), ("on", on)):
        table.add_row(
            label,
            str(len(times)),
            f"{statistics.median(times):.3f}",
            f"{min(times):.3f}",
            f"{statistics.fmean(times):.3f}",
        )
    console.print(table)
    overhead = statistics.median(on) / statistics.median(off) - 1
    best = min(on) / min(off) - 1
    ok = overhead <= TARGET_OVERHEAD
    verdict = "[green]PASS[/green]" if ok else "[red]FAIL[/red]"
    console.print(
        f"tracing overhead: {overhead:+.1%} (medians), {best:+.1%} (best runs); "
        f"target <= +{TARGET_OVERHEAD:.0%}: {verdict}"
    )
    floor = sdk_floor(args.turns, args.repeats)
    added = statistics.median(on) - statistics.median(off)
    console.print(
        f"added per step: {added:.3f} ms; the same two spans made by the SDK in a bare loop "
        f"(warm caches, best of {args.repeats}): {floor:.3f} ms = "
        f"{floor / statistics.median(off):+.1%} of a step"
    )

    if not args.skip_mcp:
        rows = await mcp_calls(args.calls)
        calls = Table(title=f"2. One call of the same lookup function ({args.calls} calls each)")
        for col in ("how", "ms/call (median)", "ms/call (mean)", "p95"):
            calls.add_column(col, justify="right")
        for label, times in rows:
            ordered = sorted(times)
            calls.add_row(
                label,
                f"{statistics.median(times):.4f}",
                f"{statistics.fmean(times):.4f}",
                f"{ordered[int(len(ordered) * 0.95)]:.4f}",
            )
        console.print(calls)
    return 0 if ok or not args.check else 1


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
