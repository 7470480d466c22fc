"""``m2g node-agent``: the loop that applies GPUPowerLimits on a node (docs/node-agent.md).

Thin wiring around m2g.nodeagent: a watch cache of the GPUPowerLimit named after the node
(``fieldSelector metadata.name=NODE``; with ``--all-nodes``, every GPUPowerLimit and one fake
agent per GPU node: KWOK, the e2e tests and the twin), a step every ``interval`` seconds and on
every change, the status written by server-side apply (field manager ``m2g-node-agent``, the
``/status`` subresource only). SIGTERM/SIGINT: every GPU back to its default limit, then exit.
An API failure never touches the GPUs beyond the fail-safe: the lease rule still runs on the
last object seen.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from m2g.k8s import client as k
from m2g.k8s.cache import WatchCache
from m2g.model import labels as L
from m2g.model.powerlimit import (
    DEFAULT_GRACE_SECONDS,
    DEFAULT_MIN_INTERVAL_SECONDS,
    MAX_AGENT_SECONDS,
)
from m2g.nodeagent.core import NodeAgentCore
from m2g.nodeagent.nvml import FakeNvml, GpuBackend, GpuError, Nvml, ReadOnly

FIELD_MANAGER = "m2g-node-agent"
Clock = Callable[[], datetime]
#: status writes in flight at once in fleet mode: one agent per node acts in parallel on a
#: real cluster, and a 16-rack twin event changes ~250 nodes' limits (one write after the
#: other delayed the last node's cap by tens of seconds at load)
WRITE_PARALLEL = 16
#: fleet mode lists the Nodes at most this often (and when a limit names a node it has no
#: agent for), not on every change
FLEET_REFRESH_SECONDS = 30.0


def _now() -> datetime:
    return datetime.now(UTC)


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def gpu_count(node: Mapping[str, Any]) -> int:
    cap = (node.get("status") or {}).get("capacity") or {}
    try:
        return int(str(cap.get(L.GPU_RESOURCE, "0")))
    except ValueError:
        return 0


class Agent:
    """The agents of this process (one node, or with ``fleet`` every GPU node, fake GPUs)."""

    def __init__(self, kube: k.Kube, cores: dict[str, NodeAgentCore], *, fleet: bool = False,
                 grace: float = DEFAULT_GRACE_SECONDS,
                 min_interval: float = DEFAULT_MIN_INTERVAL_SECONDS,
                 clock: Clock = _now) -> None:
        self.kube, self.cores, self.fleet, self.clock = kube, cores, fleet, clock
        self.grace, self.min_interval = grace, min_interval
        query = None if fleet else {"fieldSelector": f"metadata.name={next(iter(cores))}"}
        self.cache = WatchCache(kube, k.GPU_POWER_LIMITS, params=query, watch_timeout=120)
        self._fleet_at: float | None = None  # monotonic time of the last node list

    def fleet_due(self, now: float) -> bool:
        """Fleet mode: list the Nodes now? (first tick, every FLEET_REFRESH_SECONDS, or a
        limit for a node with no agent yet)."""
        if not self.fleet:
            return False
        if self._fleet_at is None or now - self._fleet_at >= FLEET_REFRESH_SECONDS:
            return True
        return any(name not in self.cores for name in self.cache.view())

    async def refresh_fleet(self) -> None:
        """Fleet mode: a fake agent for every GPU node (new nodes join; gone ones leave)."""
        try:
            found = await self.kube.list(k.NODES)
            self._fleet_at = time.monotonic()
        except k.KubeError as exc:
            _log(f"node-agent: listing nodes failed: {exc}")
            return
        names = set()
        for n in found.get("items") or []:
            name, gpus = (n.get("metadata") or {}).get("name", ""), gpu_count(n)
            if name and gpus > 0:
                names.add(name)
                if name not in self.cores:
                    self.cores[name] = NodeAgentCore(name, FakeNvml(gpus=gpus, node=name),
                                                     self.grace, self.min_interval)
        for gone in set(self.cores) - names:
            del self.cores[gone]

    async def tick(self) -> None:
        """One step of every agent; the statuses to write go out up to WRITE_PARALLEL at once
        (one failed write never holds up the others)."""
        now = self.clock()
        due = []
        for name, core in sorted(self.cores.items()):
            status = core.step(self.cache.get(name), now)
            if status is not None:
                due.append((name, core, status))
        gate = asyncio.Semaphore(WRITE_PARALLEL)

        async def bounded(name: str, core: NodeAgentCore, status: dict[str, Any]) -> None:
            async with gate:
                await self._write(name, core, status)

        await asyncio.gather(*(bounded(*d) for d in due))

    async def _write(self, name: str, core: NodeAgentCore, status: dict[str, Any]) -> None:
        body = {"apiVersion": k.GPU_POWER_LIMITS.api_version,
                "kind": k.GPU_POWER_LIMITS.kind, "metadata": {"name": name}, "status": status}
        try:
            await self.kube.apply(k.GPU_POWER_LIMITS, name, body, subresource="status",
                                  field_manager=FIELD_MANAGER)
        except k.NotFound:
            core.forget_status()  # released meanwhile: nothing to report on
        except k.KubeError as exc:
            core.forget_status()
            _log(f"node-agent: {name}: status not written: {exc}")
        else:
            _log(f"node-agent: {name}: {status['phase']}: {status.get('message', '')}")

    async def run(self, interval: float, stop: asyncio.Event) -> None:
        self.cache.start()
        changed = asyncio.Event()
        self.cache.subscribe(lambda *_: changed.set())
        try:
            with contextlib.suppress(TimeoutError):
                await self.cache.wait_synced(timeout=30)
            while not stop.is_set():
                if self.fleet_due(time.monotonic()):
                    await self.refresh_fleet()
                await self.tick()
                changed.clear()
                waiters = [asyncio.ensure_future(e.wait()) for e in (stop, changed)]
                await asyncio.wait(waiters, timeout=interval,
                                   return_when=asyncio.FIRST_COMPLETED)
                for w in waiters:
                    w.cancel()
        finally:
            await self.cache.stop()
            now = self.clock()
            for core in self.cores.values():
                core.release(now)
            _log(f"node-agent: stopped; default limits restored on {len(self.cores)} node(s)")


def backend(kind: str, read_only: bool, gpus: int, node: str) -> GpuBackend:
    inner: GpuBackend = FakeNvml(gpus=gpus, node=node) if kind == "fake" else Nvml()
    return ReadOnly(inner) if read_only else inner


async def _main(args: argparse.Namespace) -> int:
    try:
        kube = await k.connect(args.kubeconfig, args.context)
    except k.KubeError as exc:
        _log(f"error: cannot reach Kubernetes ({type(exc).__name__}): {str(exc)[:200]}")
        return 2
    try:
        cores: dict[str, NodeAgentCore] = {}
        if not args.all_nodes:
            try:
                gpus = backend(args.nvml, args.read_only, args.fake_gpus, args.node)
            except GpuError as exc:
                _log(f"error: {exc}")
                return 2
            cores[args.node] = NodeAgentCore(args.node, gpus, args.grace, args.min_interval)
        agent = Agent(kube, cores, fleet=args.all_nodes, grace=args.grace,
                      min_interval=args.min_interval)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        mode = "every GPU node (fake NVML)" if args.all_nodes else \
            f"node {args.node} ({args.nvml} NVML{', read-only' if args.read_only else ''})"
        _log(f"node-agent: {mode}; lease grace {args.grace:g} s, "
             f"one change per {args.min_interval:g} s")
        await agent.run(args.interval, stop)
    finally:
        await kube.close()
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="m2g node-agent", description=__doc__.split("\n")[0])
    p.add_argument("--kubeconfig")
    p.add_argument("--context")
    p.add_argument("--node", default=os.environ.get("NODE_NAME", ""))
    p.add_argument("--all-nodes", action="store_true")
    p.add_argument("--nvml", choices=("real", "fake"), default="real")
    p.add_argument("--fake-gpus", type=int, default=4)
    p.add_argument("--read-only", action="store_true")
    p.add_argument("--interval", type=float, default=5.0)
    p.add_argument("--grace", type=float, default=DEFAULT_GRACE_SECONDS)
    p.add_argument("--min-interval", type=float, default=DEFAULT_MIN_INTERVAL_SECONDS)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m m2g_controllers.nodeagent`` (what ``m2g node-agent`` runs)."""
    args = parser().parse_args(argv)
    if args.kubeconfig and not os.path.isfile(args.kubeconfig):
        _log(f"error: kubeconfig {args.kubeconfig} not found")
        return 2
    if not args.all_nodes and not args.node:
        _log("error: which node? --node NAME (or $NODE_NAME, the DaemonSet's downward API)")
        return 2
    if args.all_nodes and (args.nvml != "fake" or args.read_only):
        _log("error: --all-nodes is for KWOK and tests: it needs --nvml fake")
        return 2
    # NaN passed the old comparisons, and an infinite or 1e308-second grace raised
    # OverflowError at every step: no cap applied, none restored after its lease
    if not (0 < args.interval <= MAX_AGENT_SECONDS and 0 <= args.grace <= MAX_AGENT_SECONDS
            and 0 <= args.min_interval <= MAX_AGENT_SECONDS):
        _log(f"error: --interval must be in (0, {MAX_AGENT_SECONDS:g}] s, --grace and "
             f"--min-interval in [0, {MAX_AGENT_SECONDS:g}] s")
        return 2
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(_main(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
