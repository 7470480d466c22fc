"""The factory telemetry simulator process: KWOK pods draw no power, so this exporter models it.

Thin wiring around ``m2g.sim`` (docs/signals.md):

* every ``interval`` seconds it lists the GPU Nodes (a rack through the site's topology label
  mapping, ``--config``: by default Topograph's NVLink-domain label, else GFD's clique),
  Running pods and the
  GPUPowerLimits (the limit m2g's node agent reports in force caps that node's GPUs) through
  m2g.k8s's client (async), turns them into ``NodeInfo`` / ``PodLoad`` (pod label
  ``m2g.io/workload-kind``, GPUs from the containers' ``nvidia.com/gpu`` limits or requests) and
  calls ``m2g.sim.model.step``
  with the injected clock; a failed listing keeps the last pods (the hardware keeps drawing);
* one HTTP server (127.0.0.1:PORT by default) serves ``GET /metrics`` (DCGM names + ``m2g_sim_*``
  facility series), ``GET /faults``, ``POST /faults`` (one JSON fault, see m2g.sim.faults),
  ``DELETE /faults`` (all, or ``?target=NAME``) and ``GET /healthz``.

A bad fault spec is answered ``400`` with one line; nothing here prints a traceback for it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qs, urlparse

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from m2g.config import SiteConfigError, load_site_config
from m2g.k8s import client as k
from m2g.model import labels as L
from m2g.model.inputs import WorkloadKind
from m2g.model.labels import DEFAULT_TOPOLOGY_LABELS, TopologyLabels
from m2g.model.powerlimit import node_limit_state
from m2g.sim.exposition import FactoryCollector
from m2g.sim.faults import Fault, FaultSpecError, parse_fault
from m2g.sim.model import (
    DEFAULT_PRODUCT,
    FactoryState,
    NodeInfo,
    PodLoad,
    SimParams,
    initial_state,
    step,
    with_faults,
    with_nodes,
)

Obj = Mapping[str, Any]
Clock = Callable[[], float]


def _quantity(value: Any) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


def node_info(obj: Obj, mapping: TopologyLabels = DEFAULT_TOPOLOGY_LABELS) -> NodeInfo | None:
    """A simulated tray from a Node object; None for nodes without a rack (neither the
    mapping's rack label nor its clique label)."""
    meta = obj.get("metadata", {})
    labels = meta.get("labels") or {}
    clique = labels.get(mapping.clique, "")
    rack = (labels.get(mapping.rack) if mapping.rack else "") or clique
    if not rack:
        return None
    capacity = (obj.get("status") or {}).get("capacity") or {}
    gpus = _quantity(capacity.get(L.GPU_RESOURCE, 4)) or 4
    product = labels.get(L.GPU_PRODUCT, "").replace("-", " ") or DEFAULT_PRODUCT
    return NodeInfo(name=meta["name"], rack=rack,
                    power_domain=labels.get(mapping.power_domain, "") if mapping.power_domain
                    else "",
                    block=labels.get(mapping.block, "") if mapping.block else "", clique=clique,
                    gpus=gpus, product=product)


def pod_load(obj: Obj) -> tuple[str, PodLoad] | None:
    """(node name, load) for a Running pod holding GPUs; None otherwise."""
    spec, meta = obj.get("spec") or {}, obj.get("metadata") or {}
    node = spec.get("nodeName")
    if not node or (obj.get("status") or {}).get("phase") != "Running":
        return None
    gpus = 0
    for c in spec.get("containers") or []:
        res = c.get("resources") or {}
        amount = (res.get("limits") or {}).get(L.GPU_RESOURCE) \
            or (res.get("requests") or {}).get(L.GPU_RESOURCE)
        gpus += _quantity(amount or 0)
    if gpus <= 0:
        return None
    raw_kind = (meta.get("labels") or {}).get(L.WORKLOAD_KIND, "")
    kind = WorkloadKind(raw_kind) if raw_kind in WorkloadKind._value2member_map_ \
        else WorkloadKind.UNSPECIFIED
    name = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    return node, PodLoad(name, kind, gpus)


def group_pods(pods: Iterable[Obj]) -> dict[str, list[PodLoad]]:
    out: dict[str, list[PodLoad]] = {}
    for obj in pods:
        found = pod_load(obj)
        if found:
            out.setdefault(found[0], []).append(found[1])
    return out


class ClusterSource(Protocol):
    """Where nodes and pods come from (m2g.k8s in production, a list in tests)."""

    async def nodes(self) -> list[Obj]: ...

    async def pods(self) -> list[Obj]: ...


@dataclass
class KubeSource:
    """Lists Nodes and Running pods through m2g.k8s's client (``node_info`` keeps the GPU
    trays)."""

    kube: k.Kube

    async def nodes(self) -> list[Obj]:
        found = await self.kube.list(k.NODES)
        return list(found.get("items") or [])

    async def pods(self) -> list[Obj]:
        found = await self.kube.list(k.PODS, params={"fieldSelector": "status.phase=Running"})
        return list(found.get("items") or [])

    async def power_limits(self) -> list[Obj]:
        """GPUPowerLimits (m2g's node agents report the limit in force); none if not served."""
        try:
            found = await self.kube.list(k.GPU_POWER_LIMITS)
        except k.ResourceMissing:
            return []
        return list(found.get("items") or [])


def node_caps(limits: Iterable[Obj]) -> dict[str, float]:
    """Node → the per-GPU limit in force / default, from the agents' status (not the spec: a
    cap counts once the agent reports it applied, as on real hardware)."""
    out: dict[str, float] = {}
    for obj in limits:
        state = node_limit_state(obj)
        if state is not None and state.applied_fraction is not None:
            out[state.node] = min(1.0, max(0.0, state.applied_fraction))
    return out


@dataclass
class Simulator:
    """Holds the current state and the faults; ``tick`` advances the model once."""

    source: ClusterSource
    clock: Clock = time.time
    params: SimParams = field(default_factory=SimParams)
    log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)
    labels: TopologyLabels = DEFAULT_TOPOLOGY_LABELS
    _state: FactoryState | None = None
    _faults: list[Fault] = field(default_factory=list)
    _pods: dict[str, list[PodLoad]] = field(default_factory=dict)
    _caps: dict[str, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def state(self) -> FactoryState | None:
        with self._lock:
            return self._state

    def faults(self) -> list[Fault]:
        with self._lock:
            return list(self._faults)

    def add_fault(self, fault: Fault) -> None:
        with self._lock:
            if fault not in self._faults:
                self._faults.append(fault)

    def clear_faults(self, target: str | None = None) -> int:
        with self._lock:
            keep = [f for f in self._faults if target is not None and f.target != target]
            removed = len(self._faults) - len(keep)
            self._faults = keep
            return removed

    async def tick(self) -> FactoryState:
        now = self.clock()
        try:
            node_objs, pod_objs = await asyncio.gather(self.source.nodes(), self.source.pods())
        except Exception as exc:  # any API failure: keep modelling, say so
            self.log(f"simulator: listing nodes/pods failed ({type(exc).__name__}: "
                     f"{' '.join(str(exc).split())[:200]}); keeping the last pods")
            nodes: Sequence[NodeInfo] | None = None
        else:
            nodes = [n for n in (node_info(o, self.labels) for o in node_objs)
                     if n is not None]
            self._pods = group_pods(pod_objs)
        limits = getattr(self.source, "power_limits", None)
        if limits is not None:
            try:
                self._caps = node_caps(await limits())
            except Exception as exc:  # keep the last caps: the GPUs keep their limits
                self.log(f"simulator: listing GPUPowerLimits failed ({type(exc).__name__})")
        with self._lock:
            state, faults = self._state, tuple(self._faults)
        if state is None:
            state = initial_state(nodes or (), now, self.params, faults)
        elif nodes is not None:
            state = with_nodes(state, nodes, self.params)
        state = step(with_faults(state, faults), self._pods, now, self.params, self._caps)
        with self._lock:
            self._state = state
        return state

    async def run(self, interval: float, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.tick()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=interval)


def make_server(sim: Simulator, host: str, port: int) -> ThreadingHTTPServer:
    """The HTTP server (not yet serving); raises OSError if the port is taken."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FactoryCollector(lambda: sim.state))

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # quiet
            return

        def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _json(self, code: int, data: Any) -> None:
            self._send(code, (json.dumps(data) + "\n").encode())

        def do_GET(self) -> None:
            path = urlparse(self.path).path
            if path == "/metrics":
                self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            elif path == "/faults":
                self._json(200, [f.wire() for f in sim.faults()])
            elif path == "/healthz":
                self._send(200 if sim.state else 503, b"ok\n" if sim.state else b"starting\n",
                           "text/plain")
            else:
                self._json(404, {"error": f"no such path {path}"})

        def do_POST(self) -> None:
            if urlparse(self.path).path != "/faults":
                self._json(404, {"error": "POST only to /faults"})
                return
            length = _quantity(self.headers.get("Content-Length", "0"))
            try:
                body = json.loads(self.rfile.read(length) or b"null")
                fault = parse_fault(body)
            except json.JSONDecodeError as exc:
                self._json(400, {"error": f"bad fault spec: not JSON ({exc.msg})"})
                return
            except FaultSpecError as exc:
                self._json(400, {"error": str(exc)})
                return
            sim.add_fault(fault)
            self._json(201, fault.wire())

        def do_DELETE(self) -> None:
            url = urlparse(self.path)
            if url.path != "/faults":
                self._json(404, {"error": "DELETE only on /faults"})
                return
            target = parse_qs(url.query).get("target", [None])[0]
            self._json(200, {"removed": sim.clear_faults(target)})

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server


async def serve(source: ClusterSource, host: str, port: int, interval: float,
                clock: Clock = time.time, stop: asyncio.Event | None = None,
                log: Callable[[str], None] | None = None,
                labels: TopologyLabels = DEFAULT_TOPOLOGY_LABELS) -> None:
    """Run the simulator until ``stop`` is set (or forever); the caller builds the source."""
    sim = Simulator(source, clock, labels=labels) if log is None else \
        Simulator(source, clock, log=log, labels=labels)
    server = make_server(sim, host, port)
    thread = threading.Thread(target=server.serve_forever, name="sim-http", daemon=True)
    thread.start()
    sim.log(f"simulator: serving http://{host}:{server.server_address[1]}/metrics, "
            f"stepping every {interval:g}s")
    try:
        await sim.run(interval, stop or asyncio.Event())
    finally:
        server.shutdown()
        server.server_close()


async def _connect_and_serve(kubeconfig: str | None, context: str | None, host: str, port: int,
                             interval: float,
                             labels: TopologyLabels = DEFAULT_TOPOLOGY_LABELS) -> int:
    try:
        kube = await k.connect(kubeconfig, context)
    except k.KubeError as exc:  # any failure to connect is the user's setup: one line
        print(f"error: cannot reach Kubernetes ({type(exc).__name__}): {str(exc)[:200]}",
              file=sys.stderr)
        return 2
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await serve(KubeSource(kube), host, port, interval, stop=stop, labels=labels)
    except OSError as exc:
        print(f"error: cannot serve on {host}:{port}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    finally:
        await kube.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m m2g_controllers.simulator`` (what ``m2g simulate`` runs)."""
    parser = argparse.ArgumentParser(prog="m2g simulate", description=__doc__.split("\n")[0])
    parser.add_argument("--kubeconfig")
    parser.add_argument("--context")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9400)
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--config", help="site configuration whose topology.labels name the "
                        "rack, block and power-domain node labels (default: GFD + Topograph)")
    args = parser.parse_args(argv)
    labels = DEFAULT_TOPOLOGY_LABELS
    if args.config:
        try:
            labels = load_site_config(Path(args.config)).topology.labels
        except SiteConfigError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    if args.kubeconfig and not os.path.isfile(args.kubeconfig):
        print(f"error: kubeconfig {args.kubeconfig} not found", file=sys.stderr)
        return 2
    if args.interval <= 0:
        print("error: --interval must be positive", file=sys.stderr)
        return 2
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(_connect_and_serve(args.kubeconfig, args.context, args.host,
                                              args.port, args.interval, labels))
    return 0


if __name__ == "__main__":
    sys.exit(main())
