"""The cost of a pathological Prometheus answer: one signal answered with N tiny series (within
the byte bound, ``prometheus.maxResponseBytes``, 64 MiB), the other six with a site's normal
answers. One ``read_signals`` per child process, so each case's peak RSS is its own.

For each N: the read's wall and CPU time, the child's peak RSS (and the same child's RSS before
the read), what the read made of the signals — the flooded one and the others (fresh or
not) — and whether it ended within ``m2g run``'s 10 s bound on a read (past it, the controller
cancels the read and every signal reads missing; here it runs to its end, to show its cost).
``--max-series M`` reads with that bound instead of the configuration's default (when the code
has one: run with ``PYTHONPATH`` at an older ``src`` to measure the code before the bound).

Run: ``.venv/bin/python bench/signal_series.py [N ...]`` (default 0 500000 2000000). A
benchmark script: it prints what it measured and asserts nothing about time or memory.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import subprocess
import sys
import time

import httpx

from m2g.signals import PrometheusClient, SignalConfig, SignalName
from m2g.signals.reader import read_signals

NOW = 1_000_000.0
FLOODED = SignalName.GPU_POWER_W
RACKS = 100  # the normal answers: 100 racks of 72 GPUs (18 nodes of 4)
CONTROLLER_BOUND = 10.0  # m2g run's bound on one read (m2g_controllers.wiring)


def _normal(query: str, stamps: bool) -> bytes:
    value = str(NOW - 5) if stamps else "50"
    if query.startswith("DCGM"):
        result = [{"metric": {"Hostname": f"n{i // 4}", "gpu": str(i % 4)},
                   "value": [NOW, value]} for i in range(RACKS * 72)]
    elif "power_domain" in query:
        result = [{"metric": {"power_domain": "pd0"}, "value": [NOW, value]}]
    else:
        result = [{"metric": {"rack": f"r{i}"}, "value": [NOW, value]} for i in range(RACKS)]
    return json.dumps({"status": "success",
                       "data": {"resultType": "vector", "result": result}}).encode()


def _flood(n: int) -> bytes:
    """n series of ~30 bytes each: no labels, one sample."""
    tiny = b'{"metric":{},"value":[1000000,"1"]}'
    return (b'{"status":"success","data":{"resultType":"vector","result":['
            + b",".join([tiny] * n) + b"]}}")


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def _one(n: int, max_series: int | None) -> str:
    config = SignalConfig()
    if max_series is not None:
        config = config.model_copy(update={"max_series": max_series})
    flooded = config.signals[FLOODED].query
    bodies = {(q.query, s): (_flood(n) if q.query == flooded else _normal(q.query, s))
              for q in config.signals.values() for s in (False, True)}

    def handler(req: httpx.Request) -> httpx.Response:
        q = req.url.params["query"]
        stamps = q.startswith("timestamp(")
        return httpx.Response(200, content=bodies[(q[10:-1] if stamps else q, stamps)])

    bound = {"max_series": config.max_series} if hasattr(config, "max_series") else {}
    client = PrometheusClient("http://prom", httpx.AsyncClient(
        transport=httpx.MockTransport(handler)), clock=lambda: NOW,
        max_response_bytes=config.max_response_bytes, **bound)
    size = len(bodies[(flooded, False)])
    before = _rss_mib()
    wall, cpu = time.perf_counter(), time.process_time()
    readings = await read_signals(client, config)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    st = readings.status
    others = sum(1 for name, s in st.items() if name != FLOODED and not s.error and s.fresh)
    flood = st[FLOODED]
    what = (f"refused: {flood.error[:90]}" if flood.error
            else f"{flood.fresh} fresh, {flood.invalid} invalid, {flood.missing} missing")
    within = "yes" if wall <= CONTROLLER_BOUND else "NO: m2g run cancels it, every signal missing"
    return (f"N={n:>9,} ({size / 2**20:5.1f} MiB)  bound={bound.get('max_series', 'none')}  "
            f"wall {wall:6.2f} s  CPU {cpu:6.2f} s  peak RSS {_rss_mib():7.0f} MiB "
            f"(before {before:.0f})  others fresh {others}/6  {FLOODED}: {what}  "
            f"within {CONTROLLER_BOUND:g} s: {within}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("n", type=int, nargs="*", default=[0, 500_000, 2_000_000])
    p.add_argument("--max-series", type=int)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(asyncio.run(_one(args.n[0], args.max_series)), flush=True)
        return
    for n in args.n:
        extra = ["--max-series", str(args.max_series)] if args.max_series else []
        subprocess.run([sys.executable, __file__, "--child", str(n), *extra], check=True)


if __name__ == "__main__":
    main()
