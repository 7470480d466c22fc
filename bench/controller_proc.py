"""The m2g controller as its own process, for bench/controller_latency.py.

Builds the same objects as ``m2g_controllers.run`` (K8sCluster, Manager, PolicyStore, Metrics,
HealthServer) but reads power from a model instead of Prometheus: rack kW = idle + 1.3 kW per
GPU of the non-finished pods bound to the rack's nodes, from the controller's own pod cache
(the model of tests/e2e/test_controller_e2e.py). So shedding closes the loop without a
telemetry stack, and the process's RSS is the controller's alone.

Each reconcile is logged as one JSON line on stderr:
``{"reconcile": n, "total_s", "snapshot_s", "apply_s", "plan_s", "sheds", "checks",
"workloads", "pods", "requests", "rss_mib", "cpu_s"}`` (plan_s = total − snapshot − apply:
policies, planning, metrics; ``requests``: the API calls the reconcile made, ``{"PATCH
workloads": [count, total seconds, max seconds], ...}``; ``rss_mib``: VmRSS after it,
``cpu_s``: the process's CPU seconds so far), at most every 2 s also ``"heap"``: glibc's heap,
``[in use, free, mmapped]`` MiB (``mallinfo2``), and after a reconcile that trimmed the heap
(``HeapTrimmer``) ``"trim_mib"``: ``[VmRSS before, after]``.

    python bench/controller_proc.py --kubeconfig K --policies DIR --metrics-port P \
        [--resync-seconds S] [--check-name NAME] [--ramp-kw-per-second R] [--max-step-kw M] \
        [--profile FILE]

``--profile FILE`` runs the process under cProfile and writes its stats to FILE on exit
(``python -m pstats FILE``): where the controller's own CPU goes.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import ctypes
import json
import logging
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from m2g.k8s import client as k
from m2g.model.cluster import ClusterSnapshot
from m2g.model.plan import Plan
from m2g.planner.config import PlannerConfig
from m2g.policy import make_runtime
from m2g.signals.readings import Readings
from m2g.testing import kit
from m2g_controllers.collector import HeapTrimmer
from m2g_controllers.health import HealthServer
from m2g_controllers.manager import Manager
from m2g_controllers.metrics import Metrics
from m2g_controllers.policies import PolicyStore
from m2g_controllers.run import MIN_RECONCILE_INTERVAL
from m2g_controllers.wiring import K8sCluster

IDLE_KW = 20.0
KW_PER_GPU = 1.3


def modelled_power() -> Callable[[K8sCluster], Awaitable[Readings]]:
    """Rack kW = idle + 1.3 kW per GPU of the pods bound to the rack (fresh readings):
    m2g.testing.kit's, shared with the e2e tests."""
    return kit.modelled_power()


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def heap_mib() -> list[float] | None:
    """glibc's heap over all arenas: [in use, free but kept, mmapped] MiB; None elsewhere."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        m = libc.mallinfo2()
    except (OSError, AttributeError):
        return None
    return [round(m.uordblks / 2**20, 1), round(m.fordblks / 2**20, 1),
            round(m.hblkhd / 2**20, 1)]


class LoggedTrimmer(HeapTrimmer):
    """The manager's HeapTrimmer, remembering VmRSS before and after its last trim."""

    trimmed: list[float] | None = None

    def after_reconcile(self) -> bool:
        before = rss_mib()
        done = super().after_reconcile()
        if done:
            self.trimmed = [round(before, 1), round(rss_mib(), 1)]
        return done


def count_requests(kube: k.Kube) -> dict[str, list[float]]:
    """Wrap ``kube.request`` to tally calls by method and resource: {key: [n, total s, max s]}.
    The caller clears the returned dict when it starts a new tally (watches are not counted:
    they stream through ``call_api`` directly)."""
    tally: dict[str, list[float]] = {}
    inner = kube.request

    async def request(method: str, path: str, **kwargs: Any) -> k.Obj:
        parts = path.split("?")[0].split("/")
        kind = next((parts[i + 1] for i in range(len(parts) - 1) if parts[i] in {
            "v1", "v1beta2", "v1alpha1"} and parts[i + 1] != "namespaces"), "")
        if "namespaces" in parts:
            j = parts.index("namespaces")
            kind = parts[j + 2] if len(parts) > j + 2 else "namespaces"
        if path.endswith("/status"):
            kind += "/status"
        t = time.perf_counter()
        try:
            return await inner(method, path, **kwargs)
        finally:
            dt = time.perf_counter() - t
            row = tally.setdefault(f"{method} {kind}", [0, 0.0, 0.0])
            row[0] += 1
            row[1] += dt
            row[2] = max(row[2], dt)

    kube.request = request  # type: ignore[method-assign]
    return tally


class TimedCluster(K8sCluster):
    """K8sCluster that remembers how long the last snapshot and apply took."""

    snapshot_s = 0.0
    apply_s = 0.0

    async def snapshot(self, now: datetime) -> ClusterSnapshot:
        t = time.perf_counter()
        try:
            return await super().snapshot(now)
        finally:
            self.snapshot_s = time.perf_counter() - t

    async def apply(self, plan: Plan, *, shadow: bool) -> list[str]:
        t = time.perf_counter()
        try:
            return await super().apply(plan, shadow=shadow)
        finally:
            self.apply_s = time.perf_counter() - t


class TimedManager(Manager):
    """Manager that logs each reconcile's duration and its parts as a JSON line."""

    tally: dict[str, list[float]]  # set by serve() (count_requests)
    heap_at = 0.0  # when "heap" was last logged

    async def reconcile(self) -> Plan | None:
        cluster = self.cluster
        assert isinstance(cluster, TimedCluster)
        cluster.snapshot_s = cluster.apply_s = 0.0
        self.tally.clear()
        t = time.perf_counter()
        plan = await super().reconcile()
        total = time.perf_counter() - t
        extra: dict[str, Any] = {"rss_mib": round(rss_mib(), 1),
                                 "cpu_s": round(time.process_time(), 2)}
        if time.monotonic() - self.heap_at >= 2.0:
            self.heap_at = time.monotonic()
            extra["heap"] = heap_mib()
        if isinstance(self.trimmer, LoggedTrimmer) and self.trimmer.trimmed is not None:
            extra["trim_mib"], self.trimmer.trimmed = self.trimmer.trimmed, None
        print(json.dumps({
            "reconcile": self.state.reconciles, "at": time.time(), "total_s": round(total, 4),
            "snapshot_s": round(cluster.snapshot_s, 4), "apply_s": round(cluster.apply_s, 4),
            "plan_s": round(total - cluster.snapshot_s - cluster.apply_s, 4),
            "sheds": len(plan.sheds) if plan else 0, "checks": len(plan.checks) if plan else 0,
            "workloads": len(cluster.caches["workloads"]), "pods": len(cluster.caches["pods"]),
            "requests": {key: [int(n), round(tot, 4), round(top, 4)]
                         for key, (n, tot, top) in sorted(self.tally.items())},
            **extra,
        }), file=sys.stderr, flush=True)
        return plan


async def serve(args: argparse.Namespace, stop: asyncio.Event) -> None:
    kube = await k.connect(args.kubeconfig)
    cluster = TimedCluster(kube, readings=modelled_power(), instance="m2g-bench")
    metrics = Metrics()
    config = PlannerConfig(check_name=args.check_name,
                           ramp_kw_per_second=args.ramp_kw_per_second,
                           max_step_kw=args.max_step_kw, power_caps=args.power_caps)
    # as m2g run: gc.freeze() after each snapshot (m2g_controllers.collector)
    manager = TimedManager(cluster, PolicyStore(make_runtime()), metrics, config=config,
                           resync_seconds=args.resync_seconds, policy_dir=args.policies,
                           freeze_collector=True,
                           min_interval_seconds=args.min_reconcile_interval)
    manager.tally = count_requests(kube)
    if manager.trimmer is not None and not args.no_trim:
        manager.trimmer = LoggedTrimmer()  # as m2g run's, and logged
    elif args.no_trim:
        manager.trimmer = None
    health = HealthServer(metrics.registry, manager.ready, "127.0.0.1", args.metrics_port)
    await health.start()
    try:
        await cluster.start(manager.kick, timeout=300)
        print(json.dumps({"synced": True, "port": health.port}), file=sys.stderr, flush=True)
        manager.kick()
        await manager.run(stop)
    finally:
        await cluster.stop()
        await health.stop()
        await kube.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--policies", type=Path, required=True)
    p.add_argument("--metrics-port", type=int, default=0)
    p.add_argument("--resync-seconds", type=float, default=10.0)
    p.add_argument("--check-name", default="m2g-bench")
    p.add_argument("--min-reconcile-interval", type=float, default=MIN_RECONCILE_INTERVAL,
                   help=f"as m2g run's (default {MIN_RECONCILE_INTERVAL})")
    p.add_argument("--ramp-kw-per-second", type=float, default=PlannerConfig.ramp_kw_per_second)
    p.add_argument("--max-step-kw", type=float, default=PlannerConfig.max_step_kw)
    # The latency bench times GridEvent -> sheds: with graded curtailment on, m2g meets the
    # shortfall with GPU caps first and sheds nothing (bench/controller_latency.py --levers).
    p.add_argument("--power-caps", action=argparse.BooleanOptionalAction, default=False,
                   help="cap GPUs of flexible jobs before pausing (m2g run's default: on)")
    p.add_argument("--no-trim", action="store_true",
                   help="do not trim the C heap after reconciles (m2g run does, every 10 s)")
    p.add_argument("--profile", help="write cProfile stats of the whole run here on exit")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)

    async def go() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(args, stop)

    if not args.profile:
        asyncio.run(go())
        return 0
    prof = cProfile.Profile()
    try:
        prof.runcall(asyncio.run, go())
    finally:
        prof.dump_stats(args.profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
