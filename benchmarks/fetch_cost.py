"""What one `fetch` costs on loopback, and what the pinned connection adds to it.

What is measured
  1. `fetch`, end to end: a 1 KB HTML page from a loopback PageServer, called through the tool
     as the model would (`Tool.invoke`), one call after another, with the host allowed
     (`allow_hosts`). Two ways of naming the server: by address (``127.0.0.1``: no lookup) and
     by name (``localhost``: one getaddrinfo per connection). Milliseconds per fetch, wall and
     CPU (`time.process_time`, the server's thread included; far less disturbed by other load
     on the machine than wall time): the median of `--repeats` rounds of `--calls` fetches,
     after a warm-up. It uses only `web_tools(allow_hosts=...)`, so the same section measures
     any revision: run it on two checkouts to compare them.
  2. The connection alone (`--connections`, this revision only): one httpx client sending GET
     after GET with ``Connection: close``, so every request connects anew, through
     httpx's own transport and through `GuardedTransport`, rounds interleaved. The difference
     is what pinning costs per connection: the guard's lookup and judgement, and the backend.

Timings depend on the machine and on whatever else it is doing: compare figures taken on the
same machine, at the same time.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable

import httpx
from pydantic import BaseModel

from keel.evals.pageserver import PageServer
from keel.tools.base import Tool
from keel.tools.web import web_tools

PAGE = "<html><head><title>t</title></head><body>" + "<p>lorem ipsum dolor</p>" * 40 + "</body>"
HOSTS = ("127.0.0.1", "localhost")
CLOSE = {"Connection": "close"}
"""The page server keeps connections alive; section 2 wants a new connection per request."""


async def timed(step: Callable[[], Awaitable[None]], calls: int) -> tuple[float, float]:
    """(wall, cpu) milliseconds per call of `step`."""
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        await step()
    return (
        (time.perf_counter() - wall) * 1000 / calls,
        (time.process_time() - cpu) * 1000 / calls,
    )


def summary(rounds: list[tuple[float, float]]) -> str:
    wall = statistics.median(r[0] for r in rounds)
    cpu = statistics.median(r[1] for r in rounds)
    return f"wall {wall:7.3f}  cpu {cpu:7.3f} ms"


async def fetch_section(server: PageServer, calls: int, repeats: int) -> None:
    print(f"fetch, end to end (median of {repeats} rounds of {calls}):")
    for host in HOSTS:
        (fetch, _observe) = web_tools(allow_hosts=[host])
        arguments = fetch.validate({"url": f"http://{host}:{server.port}/page"})

        async def one(fetch: Tool = fetch, arguments: BaseModel = arguments) -> None:
            text = await fetch.invoke(arguments)
            assert "lorem ipsum" in text, text

        await timed(one, 20)  # warm-up: imports, caches, the server's threads
        rounds = [await timed(one, calls) for _ in range(repeats)]
        print(f"  {host:10} {summary(rounds)} per fetch")


async def connection_section(server: PageServer, calls: int, repeats: int) -> None:
    from keel.tools.pinned import GuardedTransport

    print(f"one request on a new connection (median of {repeats} rounds of {calls}):")
    for host in HOSTS:
        url = f"http://{host}:{server.port}/page"
        transports: dict[str, httpx.AsyncBaseTransport] = {
            "httpx": httpx.AsyncHTTPTransport(trust_env=False),
            "pinned": GuardedTransport([host]),
        }
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in transports}
        clients = {
            name: httpx.AsyncClient(transport=transport, trust_env=False)
            for name, transport in transports.items()
        }
        try:
            for round_ in range(repeats + 1):
                for name, client in clients.items():

                    async def one(client: httpx.AsyncClient = client, url: str = url) -> None:
                        response = await client.get(url, headers=CLOSE)
                        assert response.status_code == 200

                    figures = await timed(one, calls)
                    if round_:  # the first round warms up
                        results[name].append(figures)
        finally:
            for client in clients.values():
                await client.aclose()
        plain, pinned = (statistics.median(r[1] for r in results[n]) for n in transports)
        for name in transports:
            print(f"  {host:10} {name:6} {summary(results[name])} per request")
        print(f"  {host:10} pinning adds {pinned - plain:+.3f} ms cpu per connection")


async def measure(options: argparse.Namespace) -> None:
    with PageServer() as server:
        server.add_page("/page", PAGE)
        await fetch_section(server, options.calls, options.repeats)
        if options.connections:
            await connection_section(server, options.calls, options.repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--connections", action="store_true", help="add section 2")
    asyncio.run(measure(parser.parse_args()))


if __name__ == "__main__":
    main()
