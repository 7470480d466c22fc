"""The cost of a pathological Prometheus answer: one signal answered with N tiny series (within
the byte bound, ``prometheus.maxResponseBytes``, 64 MiB), the other six with a site's normal
answers. One ``read_signals`` per child process, so each case's peak RSS is its own.

For each N: the read's wall and CPU time, the child's peak RSS during the read (Linux's VmHWM,
reset before it; and the same child's RSS before the read), what the read made of the signals
— the flooded one and the others (fresh or not) — and whether it ended within ``m2g run``'s
10 s bound on a read (past it, the controller cancels the read and every signal reads missing;
here it runs to its end, to show its cost).
``--max-series M`` reads with that bound instead of the configuration's default (when the code
has one: run with ``PYTHONPATH`` at an older ``src`` to measure the code before the bound).

``--array``: the flooded signal is answered with ONE series whose ``value`` is an array of N
numbers (``0.5``, 4 bytes each with its comma: 16 M numbers are 61 MiB, within the byte bound)
instead of N series; ``--padded S`` puts S tiny series before that series (the most values an
answer within the series bound can carry). ``--max-values-per-series K`` reads with that
bound instead of the default (``prometheus.maxValuesPerSeries``, when the code has one);
``--max-values V`` the bound on an answer's values in all (``prometheus.maxValues``).
``--labels L``: the N series each carry L labels of a DCGM exporter's length (a site's large
answer, not a hostile one).

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
from collections.abc import AsyncIterator

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


def _flood(n: int, labels: int = 0) -> bytes:
    """n series of ~30 bytes each: no labels, one sample (with ``labels``, at least 2: that
    many labels of ~30 bytes each, the last two a DCGM series' ``Hostname`` and ``gpu``)."""
    tiny = b'{"metric":{},"value":[1000000,"1"]}'
    if labels:
        head = "".join(f'"label_{i:02}":"value-{i:02}-0123456789abcdef",'
                       for i in range(labels - 2))
        return (b'{"status":"success","data":{"resultType":"vector","result":['
                + ",".join(f'{{"metric":{{{head}"Hostname":"node-{i // 4:06}","gpu":"{i % 4}"}},'
                           f'"value":[1000000,"1"]}}' for i in range(n)).encode() + b"]}}")
    return (b'{"status":"success","data":{"resultType":"vector","result":['
            + b",".join([tiny] * n) + b"]}}")


def _array(n: int, padded: int) -> bytes:
    """One series whose ``value`` is an array of n numbers, after ``padded`` tiny series."""
    tiny = b'{"metric":{},"value":[1000000,"1"]},'
    return (b'{"status":"success","data":{"resultType":"vector","result":[' + tiny * padded
            + b'{"metric":{},"value":[' + b"0.5," * (n - 1) + b"0.5]}]}}")


class _Chunks(httpx.AsyncByteStream):
    """A canned answer sent in chunks of 64 KiB, as a socket delivers it (one chunk of 61 MiB
    would be counted, and copied, whole before any bound is checked)."""

    def __init__(self, body: bytes) -> None:
        self.body = body

    async def __aiter__(self) -> AsyncIterator[bytes]:
        view = memoryview(self.body)
        for at in range(0, len(view), 1 << 16):
            yield bytes(view[at:at + (1 << 16)])


def _status_mib(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _reset_peak() -> None:
    """Reset the peak RSS (Linux's VmHWM) so that the read's own peak is measured, not the
    building of the canned answers (a no-op where /proc/self/clear_refs cannot be written)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


async def _one(n: int, args: argparse.Namespace) -> str:
    config = SignalConfig()
    bounds = {"max_series": args.max_series,
              "max_values_per_series": args.max_values_per_series,
              "max_values": args.max_values}
    config = config.model_copy(update={k: v for k, v in bounds.items() if v is not None})
    flooded = config.signals[FLOODED].query
    answer = _array(n, args.padded) if args.array else _flood(n, args.labels)
    bodies = {(q.query, s): (answer if q.query == flooded else _normal(q.query, s))
              for q in config.signals.values() for s in (False, True)}

    def handler(req: httpx.Request) -> httpx.Response:
        q = req.url.params["query"]
        stamps = q.startswith("timestamp(")
        return httpx.Response(200, stream=_Chunks(bodies[(q[10:-1] if stamps else q, stamps)]))

    bound = {k: getattr(config, k) for k in bounds if hasattr(config, k)}
    client = PrometheusClient("http://prom", httpx.AsyncClient(
        transport=httpx.MockTransport(handler)), clock=lambda: NOW,
        max_response_bytes=config.max_response_bytes, **bound)
    size = len(bodies[(flooded, False)])
    before = _status_mib("VmRSS")
    _reset_peak()
    wall, cpu = time.perf_counter(), time.process_time()
    readings = await read_signals(client, config)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    st = readings.status
    others = sum(1 for name, s in st.items() if name != FLOODED and not s.error and s.fresh)
    flood = st[FLOODED]
    what = (f"refused: {flood.error[:90]}" if flood.error
            else f"{flood.fresh} fresh, {flood.invalid} invalid, {flood.missing} missing")
    within = "yes" if wall <= CONTROLLER_BOUND else "NO: m2g run cancels it, every signal missing"
    shape = (f"array+{args.padded:,}" if args.array
             else f"series of {args.labels} labels" if args.labels else "series")
    return (f"N={n:>10,} {shape} ({size / 2**20:5.1f} MiB)  "
            f"bounds={'/'.join(f'{v:,}' for v in bound.values()) or 'none'}  "
            f"wall {wall:6.2f} s  CPU {cpu:6.2f} s  peak RSS {_status_mib('VmHWM'):7.0f} MiB "
            f"(before {before:.0f})  others fresh {others}/6  {FLOODED}: {what}  "
            f"within {CONTROLLER_BOUND:g} s: {within}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("n", type=int, nargs="*", default=[0, 500_000, 2_000_000])
    p.add_argument("--max-series", type=int)
    p.add_argument("--max-values-per-series", type=int)
    p.add_argument("--max-values", type=int)
    p.add_argument("--labels", type=int, default=0)
    p.add_argument("--array", action="store_true")
    p.add_argument("--padded", type=int, default=0)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(asyncio.run(_one(args.n[0], args)), flush=True)
        return
    extra = [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items()
             if k in ("max_series", "max_values_per_series", "max_values", "padded", "labels")
             and v]
    extra += ["--array"] if args.array else []
    for n in args.n:
        subprocess.run([sys.executable, __file__, "--child", str(n), *extra], check=True)


if __name__ == "__main__":
    main()
