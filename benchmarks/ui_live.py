"""What `keel ui`'s live views cost: CPU per open tab, and memory once the tabs close.

A run of about 20,000 events (5,000 steps through the real loop, paused on an approval at the
end) is served by a real `keel ui` process. Then:

- `--tabs N` (default 20) live views of that page stay open for `--seconds S` (10): the server's
  CPU time over that window (from /proc), per tab, as a share of one core. Nothing changes in
  the store meanwhile, so this is what a paused run's page costs while nobody acts.
- 100 live views are opened one after another and kept open, then all closed: the server's
  resident memory (VmRSS) before, while they are open, and 3 s and 18 s after they closed.

With `--pages` each tab also loads the run's page (5 MB of HTML) before its stream, as a
browser does; without, the streams start where the page loaded once at the start left off.

Usage: `.venv/bin/python benchmarks/ui_live.py [--steps 5000] [--tabs 20] [--seconds 10]
[--views 100] [--pages]`.
Figures depend on the machine; compare runs on the same one.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from big_runs import paused_run  # the run the web view's tests use, at benchmark size

TICKS = os.sysconf("SC_CLK_TCK")
PAGES = False
"""Each tab loads the page before its stream (`--pages`)."""
KEYS = 250
"""Distinct calls of the run: each is repeated steps/KEYS times, so the page draws its charts."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def open_view(url: str, ready: threading.Event, stop: threading.Event) -> None:
    """One tab: the live stream, held open until `stop`; `ready` once the server answered.
    With PAGES set, the tab loads the run's page first, as a browser does."""
    if PAGES:
        httpx.get(url.split("/live", 1)[0], timeout=120)
    with httpx.stream("GET", url, timeout=None) as response:
        assert response.status_code == 200
        ready.set()
        stop.wait()


def opened(url: str, tabs: int, stop: threading.Event) -> list[threading.Thread]:
    """`tabs` live views, each answered before the next is opened."""
    threads = []
    for _ in range(tabs):
        ready = threading.Event()
        thread = threading.Thread(target=open_view, args=(url, ready, stop), daemon=True)
        thread.start()
        ready.wait(60)
        threads.append(thread)
    return threads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--tabs", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--views", type=int, default=100)
    parser.add_argument("--pages", action="store_true", help="each tab loads the page first")
    options = parser.parse_args()
    global PAGES
    PAGES = options.pages
    with tempfile.TemporaryDirectory() as folder:
        store = Path(folder) / "runs.sqlite"
        run_id, events = paused_run(store, options.steps, KEYS)
        port = free_port()
        server = subprocess.Popen(
            [sys.executable, "-m", "keel", "ui", "--store", str(store), "--port", str(port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        try:
            assert server.stdout is not None
            base = server.stdout.readline().strip()
            page = httpx.get(f"{base}runs/{run_id}", timeout=60)
            seq = page.text.split('data-seq="', 1)[1].split('"', 1)[0]
            live = f"{base}runs/{run_id}/live?after={seq}"
            print(
                f"run of {events} events, paused; page {len(page.content) / 1e6:.1f} MB; "
                f"server RSS {rss_mb(server.pid):.0f} MB"
            )
            measure(server.pid, live, options)
        finally:
            server.terminate()
            server.wait(30)


def measure(pid: int, live: str, options: argparse.Namespace) -> None:
    stop = threading.Event()
    tabs = opened(live, options.tabs, stop)
    time.sleep(2.0)  # every view past its first round
    before = cpu_seconds(pid)
    time.sleep(options.seconds)
    used = cpu_seconds(pid) - before
    share = used / options.seconds / options.tabs
    print(f"{options.tabs} open tabs, {options.seconds:g} s: {used:.2f} CPU s, "
          f"{share * 100:.2f}% of a core per tab")  # fmt: skip
    stop.set()
    for thread in tabs:
        thread.join(5)
    time.sleep(3.0)
    start_rss = rss_mb(pid)
    stop = threading.Event()
    views = opened(live, options.views, stop)
    time.sleep(3.0)
    peak = rss_mb(pid)
    stop.set()
    for thread in views:
        thread.join(5)
    time.sleep(3.0)
    after = rss_mb(pid)
    time.sleep(15.0)  # past the streams' keep-alive, when a write finds a closed client
    print(f"{options.views} live views open at once, then closed: RSS {start_rss:.0f} MB "
          f"before, {peak:.0f} MB open, {after:.0f} MB 3 s after closing, "
          f"{rss_mb(pid):.0f} MB 18 s after")  # fmt: skip


if __name__ == "__main__":
    main()
