"""``m2g run``: the controller process (leader election, caches, the loop, /metrics, /readyz).

    python -m m2g_controllers.run [--kubeconfig K] [--context C] [--shadow] [--policies DIR]
        [--prometheus URL] [--leader-elect --lease-namespace NS] [--metrics-port 8080]

Logs are JSON lines on stderr. SIGTERM/SIGINT stop the loop, release the Lease and exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import socket
import sys
import warnings
from pathlib import Path

from m2g.k8s import client as k
from m2g.k8s.leader import LeaderElector
from m2g.planner.config import PlannerConfig
from m2g.policy import EngineUnavailable, make_runtime
from m2g_controllers.health import HealthServer
from m2g_controllers.manager import Manager
from m2g_controllers.metrics import Metrics
from m2g_controllers.policies import PolicyStore
from m2g_controllers.wiring import K8sCluster

log = logging.getLogger("m2g")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg."""

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps({"ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S%z"),
                           "level": record.levelname.lower(), "logger": record.name,
                           "msg": record.getMessage()})


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="m2g run", description=__doc__.splitlines()[0])
    p.add_argument("--kubeconfig")
    p.add_argument("--context")
    p.add_argument("--shadow", action="store_true", help="decide and record, write nothing")
    p.add_argument("--policies", type=Path, help="policy folder (default: Policy objects)")
    p.add_argument("--prometheus", default=os.environ.get("M2G_PROMETHEUS_URL"),
                   help="Prometheus URL for power, thermal and XID signals")
    p.add_argument("--leader-elect", action="store_true", help="campaign for a Lease")
    p.add_argument("--lease-namespace", default="m2g-system")
    p.add_argument("--lease-name", default="m2g-controller")
    p.add_argument("--identity", default=os.environ.get("POD_NAME") or socket.gethostname())
    p.add_argument("--metrics-port", type=int, default=8080)
    p.add_argument("--metrics-host", default="0.0.0.0")
    p.add_argument("--resync-seconds", type=float, default=10.0)
    p.add_argument("--check-name", default="m2g-policy")
    p.add_argument("--engine", choices=["cel-expr-python", "cel-python"])
    p.add_argument("--log-level", default="info")
    return p.parse_args(argv)


async def kick_on_leadership(elector: LeaderElector, manager: Manager,
                             stop: asyncio.Event) -> None:
    """Reconcile at once when this replica becomes the leader (not at the next resync)."""
    while not stop.is_set():
        await elector.leading.wait()
        manager.kick()
        while elector.is_leader and not stop.is_set():
            await asyncio.sleep(0.5)


async def serve(args: argparse.Namespace, stop: asyncio.Event) -> int:
    kube = await k.connect(args.kubeconfig, args.context)
    cluster = K8sCluster(kube, prometheus=args.prometheus, instance=args.identity)
    metrics = Metrics()
    elector = LeaderElector(kube, args.lease_name, args.lease_namespace, args.identity) \
        if args.leader_elect else None
    manager = Manager(cluster, PolicyStore(make_runtime(args.engine)), metrics,
                      config=PlannerConfig(check_name=args.check_name), shadow=args.shadow,
                      is_leader=(lambda: elector.is_leader) if elector else (lambda: True),
                      resync_seconds=args.resync_seconds, policy_dir=args.policies)
    health = HealthServer(metrics.registry, manager.ready, args.metrics_host, args.metrics_port)
    await health.start()
    log.info("serving /metrics /healthz /readyz on %s:%d", args.metrics_host, health.port)
    tasks = []
    try:
        await cluster.start(manager.kick)
        log.info("caches synced; shadow=%s leader-elect=%s", args.shadow, bool(elector))
        if elector is not None:
            tasks.append(asyncio.create_task(elector.run(stop)))
            tasks.append(asyncio.create_task(kick_on_leadership(elector, manager, stop)))
        manager.kick()
        await manager.run(stop)
    finally:
        for t in tasks:
            t.cancel()
        if elector is not None and elector.is_leader:
            await elector.release()
        await cluster.stop()
        await health.stop()
        await kube.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    logging.basicConfig(level=args.log_level.upper(), handlers=[handler])
    for chatty in ("httpx", "httpcore", "kr8s"):  # one line per HTTP request buries decisions
        logging.getLogger(chatty).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message="Kubernetes version .* is not supported")

    async def go() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        return await serve(args, stop)

    try:
        return asyncio.run(go())
    except (k.KubeError, EngineUnavailable, OSError, TimeoutError) as exc:
        print(f"error: m2g run: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
