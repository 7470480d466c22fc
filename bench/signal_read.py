"""One signal read (``m2g.signals.reader.read_signals``: 7 signals, each query and its
``timestamp(q)``) of N series a signal from canned answers (no network), with a task beside it
that wakes every 1 ms: the read's wall and CPU time and the longest the event loop kept that
task waiting — what the lease renewal, the admission answers and the watches wait for while
m2g reads its signals.

Run: ``.venv/bin/python bench/signal_read.py [N ...]`` (default 20000). A benchmark script: it
prints what it measured and asserts nothing about time.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import httpx

from m2g.signals import PrometheusClient, SignalConfig
from m2g.signals.reader import read_signals

NOW = 1_000_000.0


def answers(n: int) -> dict[bool, bytes]:
    """The answer of every query (False) and of every ``timestamp(q)`` (True): n GPUs, 4 a
    node, 72 a rack."""
    out = {}
    for stamps in (False, True):
        result = [{"metric": {"__name__": "x", "Hostname": f"n{i // 4}", "gpu": str(i % 4),
                              "rack": f"r{i // 72}"},
                   "value": [NOW, str(NOW - 5) if stamps else "500"]} for i in range(n)]
        out[stamps] = json.dumps({"status": "success", "data": {
            "resultType": "vector", "result": result}}).encode()
    return out


async def measure(n: int) -> str:
    bodies = answers(n)

    def handler(req: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=bodies[
            req.url.params["query"].startswith("timestamp(")])

    client = PrometheusClient("http://prom", httpx.AsyncClient(
        transport=httpx.MockTransport(handler)), clock=lambda: NOW,
        max_response_bytes=1 << 30)
    gaps: list[float] = []
    done = False

    async def beside() -> None:
        last = time.perf_counter()
        while not done:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    task = asyncio.create_task(beside())
    wall, cpu = time.perf_counter(), time.process_time()
    await read_signals(client, SignalConfig())
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    done = True
    await task
    return (f"{n:,} series a signal: read {wall:.2f} s wall, {cpu:.2f} s CPU; longest wait "
            f"of the task beside it {max(gaps) * 1000:.0f} ms ({len(gaps)} wake-ups)")


def main() -> None:
    for n in [int(a) for a in sys.argv[1:]] or [20_000]:
        print(asyncio.run(measure(n)))


if __name__ == "__main__":
    main()
