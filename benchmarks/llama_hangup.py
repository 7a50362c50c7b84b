"""What a request Keel's timeout gives up leaves running on llama-cpp-python's server (ADR 0065).

Starts ``python -m llama_cpp.server`` (chatml, 4,096-token window, two threads) on the
embedded 0.5B's weights, then, once per mode given (``always``: the Chat transport's default
for a compatible server, streamed; ``when-watched``: whole, as before ADR 0065's change):

- sends a runaway (1,500 tokens, made certain with the server's own ``min_tokens``) and gives
  it up by Keel's model timeout (3 s);
- after 1.5 s of grace, reads the server process's CPU time over 3 s (an idle server: about
  0.01 s);
- sends a short request ("Say hi.", 4 tokens) and times it: whole, it waits behind the runaway.

Needs ``pip install 'keel-runtime[local-0-5b]' 'llama-cpp-python[server]'``. Usage:
``python benchmarks/llama_hangup.py [always|when-watched ...]`` (default: both). Timings depend
on whatever else the machine is doing.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from keel._run.gateway import attempt
from keel.errors import ProviderError
from keel.limits import Limits
from keel.transports.local.weights import QWEN25_CODER_05B, ensure_model
from keel.transports.openai_chat import OpenAIChatTransport, StreamWhen
from test_compat_llama_hangup import WritesToItsLimit, ask, cpu_seconds

RUNAWAY, TIMEOUT, GRACE, WATCHED = 1500, 3.0, 1.5, 3.0


def serve(model: Path) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--host",
               "127.0.0.1", "--port", str(port), "--chat_format", "chatml", "--n_ctx", "4096",
               "--n_threads", "2"]  # fmt: skip
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/v1"
    for _ in range(480):
        try:
            if httpx.get(f"{url}/models", timeout=2).status_code == 200:
                return server, url
        except httpx.TransportError:
            time.sleep(0.25)
    server.kill()
    raise SystemExit("llama_cpp.server did not start")


async def once(url: str, pid: int, stream: StreamWhen) -> str:
    client = httpx.AsyncClient(transport=WritesToItsLimit())
    runaway = OpenAIChatTransport(
        "m", base_url=url, http_client=client, max_tokens=RUNAWAY, stream=stream
    )
    with contextlib.suppress(ProviderError):  # the timeout, as wanted
        await attempt(runaway, ask("Say hi."), Limits(model_timeout=TIMEOUT), None)
    await client.aclose()
    await asyncio.sleep(GRACE)
    start = cpu_seconds(pid)
    await asyncio.sleep(WATCHED)
    spent = cpu_seconds(pid) - start
    began = time.monotonic()
    short = OpenAIChatTransport("m", base_url=url, max_tokens=4, stream="when-watched")
    await short.request(ask("Say hi."))
    waited = time.monotonic() - began
    return f"{stream:>12}: server CPU {spent:.2f} s over {WATCHED:.0f} s; next {waited:.1f} s"


def main() -> None:
    modes = sys.argv[1:] or ["always", "when-watched"]
    server, url = serve(ensure_model(QWEN25_CODER_05B))
    try:
        for mode in modes:
            print(asyncio.run(once(url, server.pid, mode)), flush=True)  # type: ignore[arg-type]
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
