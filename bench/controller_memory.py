"""Where the controller's memory goes, offline: the controller bench's objects without a cluster.

The objects of ``bench/controller_latency.py``'s large factory (100 NVL72 racks, 1,800 nodes,
2,000 Jobs' Workloads of its mix with 2,500 pods), shaped like the API server's (the fixtures
of tests/unit/fixtures/k8s: a KWOK node, a running pod, an admitted Workload), are folded into
the controller's watch caches as watch events (decoded from JSON, as the watch stream does),
and the controller's objects (``K8sCluster``, ``Manager`` with the bench's policies and
``gc.freeze`` after each snapshot, modelled power) reconcile over them with an in-memory API
server for the writes. Each round is the latency bench's: a GridEvent whose limit needs
``--shed-kw`` of savings, reconciles until m2g has shed, a stand-in for Kueue evicting the shed
workloads (their pods deleted, the Workloads' status changed), the event deleted, the restores,
Kueue's stand-in admitting them again with new pods. ``min_shed_seconds`` is 0 so that a
round takes seconds, not minutes.

    python bench/controller_memory.py [--rounds N] [--reconciles-per-round N]
        [--tracemalloc] [--top N]

Prints RSS (VmRSS) after the setup and after each round and, with ``--tracemalloc``, the
allocations by line that grew most since the setup and the largest at the end. A benchmark
script, never a test: it asserts nothing about memory.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import gc
import hashlib
import json
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from controller_proc import heap_mib, rss_mib

from m2g.k8s import client as k
from m2g.planner.config import PlannerConfig
from m2g.policy import make_runtime
from m2g.testing import kit
from m2g.testing.kube import FakeKube
from m2g_controllers.manager import Manager
from m2g_controllers.metrics import Metrics
from m2g_controllers.policies import PolicyStore
from m2g_controllers.wiring import K8sCluster

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "unit" / "fixtures" / "k8s"
CHECK = "m2g-bench"
CQ = "m2g-bench"
RACKS, NODES_PER_RACK, GPUS_PER_NODE = 100, 18, 4
#: (pods, GPUs per pod), as bench/controller_latency.py
SHAPES = [(1, 1), (1, 2), (1, 4), (2, 2), (1, 1), (1, 2), (2, 4), (1, 2)]
IDLE_KW, KW_PER_GPU = 20.0, 1.3
Obj = dict[str, Any]


def hwm_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def heap() -> str:
    """glibc's heap (all arenas): in use, free (kept, not returned), mmapped; MiB."""
    got = heap_mib()  # bench/controller_proc.py's reading, shared with the controller bench
    if got is None:
        return "glibc heap: not glibc"
    return f"glibc heap in use {got[0]:.0f}, free {got[1]:.0f}, mmapped {got[2]:.0f} MiB"


def fixture(name: str) -> Obj:
    obj: Obj = json.loads((FIXTURES / name).read_text())
    return obj


def stamp(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Api(FakeKube):
    """FakeKube that keeps no call log and no Events (their memory is not the controller's),
    and tells the harness which objects m2g wrote."""

    def __init__(self) -> None:
        super().__init__()
        self.touched: set[tuple[str, str, str]] = set()

    def _check(self, verb: str, res: k.Resource, name: str) -> None:
        return None

    async def create(self, res: k.Resource, body: Obj, namespace: str | None = None,
                     dry_run: bool = False) -> Obj:
        if res.plural == "events":
            return copy.deepcopy(body)
        return await super().create(res, body, namespace, dry_run)

    async def patch(self, res: k.Resource, name: str, body: Any, **kw: Any) -> Obj:
        out = await super().patch(res, name, body, **kw)
        self.touched.add((res.plural, kw.get("namespace") or "", name))
        return out

    async def apply(self, res: k.Resource, name: str, body: Obj, **kw: Any) -> Obj:
        out = await super().apply(res, name, body, **kw)
        self.touched.add((res.plural, kw.get("namespace") or "", name))
        return out


class World:
    """The objects, the controller's caches fed as a watch would, and Kueue's stand-in."""

    def __init__(self, api: Api, cluster: K8sCluster) -> None:
        self.api, self.cluster = api, cluster
        self.node_t, self.pod_t, self.wl_t = (fixture("node_kwok.json"),
                                              fixture("pod_running.json"),
                                              fixture("workload_admitted.json"))
        self.free: dict[str, int] = {}
        self.pods_of: dict[str, list[str]] = {}  # workload key → its pods' keys
        self.serial = 0

    def deliver(self, cache: str, kind: str, obj: Obj) -> None:
        """One watch event: the object as the stream decodes it (fresh strings)."""
        self.cluster.caches[cache].apply_event(
            {"type": kind, "object": json.loads(json.dumps(obj))})

    def put(self, res: k.Resource, cache: str, obj: Obj, kind: str = "ADDED") -> Obj:
        stored = self.api.put(res, obj)
        self.deliver(cache, kind, stored)
        return stored

    def node(self, r: int, i: int) -> Obj:
        o = copy.deepcopy(self.node_t)
        name = f"large-r{r:03d}-n{i:02d}"
        o["metadata"]["name"] = name
        labels = o["metadata"]["labels"]
        labels.update({"kubernetes.io/hostname": name, "m2g.io/factory": "large",
                       "network.topology.nvidia.com/accelerator": f"rack-{r:03d}",
                       "network.topology.nvidia.com/block": f"block-{r // 8:02d}",
                       "nvidia.com/gpu.clique": f"7b968a6d-c8aa-45e1-9e07-e1e51be9{r:04d}.0"})
        self.free[name] = GPUS_PER_NODE
        return o

    def workload(self, i: int) -> tuple[Obj, int, int]:
        pods, per = SHAPES[(i // 4) % len(SHAPES)]
        o = copy.deepcopy(self.wl_t)
        ns, job = f"bench-{i % 8}", f"w{i:05d}"
        m = o["metadata"]
        m.update(name=f"job-{job}-{i:05x}", namespace=ns, uid=f"wl-{i:08d}")
        m["labels"]["kueue.x-k8s.io/job-uid"] = f"job-{i:08d}"
        m["ownerReferences"][0].update(name=job, uid=f"job-{i:08d}")
        ps = o["spec"]["podSets"][0]
        ps["count"] = pods
        ps["template"]["metadata"]["labels"]["m2g.io/flex-tier"] = str(i % 4)
        ps["template"]["metadata"]["annotations"]["m2g.io/estimated-kw"] = str(
            round(pods * per * KW_PER_GPU, 1))
        res = ps["template"]["spec"]["containers"][0]["resources"]
        res["limits"]["nvidia.com/gpu"] = res["requests"]["nvidia.com/gpu"] = str(per)
        o["spec"]["queueName"] = "default"
        o["status"]["admission"]["clusterQueue"] = CQ
        o["status"]["admissionChecks"] = [{"name": CHECK, "state": "Ready", "message": "ok",
                                           "lastTransitionTime": stamp(datetime.now(UTC))}]
        return o, pods, per

    def pods_for(self, wl: Obj, pods: int, per: int) -> list[Obj]:
        out = []
        m = wl["metadata"]
        owner = m["ownerReferences"][0]
        for _ in range(pods):
            host = next((n for n, f in self.free.items() if f >= per), None)
            if host is None:
                break
            self.free[host] -= per
            self.serial += 1
            p = copy.deepcopy(self.pod_t)
            pm = p["metadata"]
            pm.update(name=f"{owner['name']}-{self.serial:05x}", namespace=m["namespace"],
                      uid=f"pod-{self.serial:08d}", generateName=f"{owner['name']}-")
            pm["ownerReferences"][0].update(name=owner["name"], uid=owner["uid"])
            pm["labels"]["batch.kubernetes.io/job-name"] = owner["name"]
            pm["labels"]["job-name"] = owner["name"]
            tmpl = wl["spec"]["podSets"][0]["template"]
            pm["labels"]["m2g.io/flex-tier"] = tmpl["metadata"]["labels"]["m2g.io/flex-tier"]
            p["spec"]["nodeName"] = host
            c = p["spec"]["containers"][0]
            c["resources"] = copy.deepcopy(tmpl["spec"]["containers"][0]["resources"])
            out.append(p)
        return out

    def setup(self, workloads: int, pending: int = 0) -> None:
        for obj, res, cache in [
                (kit.cluster_queue(CQ, "bench-0", "gb200", RACKS * NODES_PER_RACK * GPUS_PER_NODE,
                                   check=CHECK), k.CLUSTER_QUEUES, "cluster_queues"),
                ({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
                  "metadata": {"name": "gb200"}, "spec": {}}, k.RESOURCE_FLAVORS,
                 "resource_flavors"),
                ({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "AdmissionCheck",
                  "metadata": {"name": CHECK}, "spec": {"controllerName": "m2g.io/policy"},
                  "status": {"conditions": [{"type": "Active", "status": "True",
                                             "observedGeneration": 1, "reason": "Active",
                                             "message": "", "lastTransitionTime":
                                             stamp(datetime.now(UTC))}]}},
                 k.ADMISSION_CHECKS, "admission_checks"),
                ({"apiVersion": "m2g.io/v1alpha1", "kind": "PowerDomain",
                  "metadata": {"name": "m2g-bench-site"},
                  "spec": {"level": "Site", "budgetKw": 1_000_000}}, k.POWER_DOMAINS,
                 "power_domains")]:
            self.put(res, cache, obj)
        for ns in range(8):
            self.put(k.LOCAL_QUEUES, "local_queues", kit.local_queue(f"bench-{ns}", CQ))
        for r in range(RACKS):
            for i in range(NODES_PER_RACK):
                self.put(k.NODES, "nodes", self.node(r, i))
        for i in range(workloads):
            wl, pods, per = self.workload(i)
            if i < pending:  # quota reserved, m2g's check Pending: answered by the controller
                wl["status"]["conditions"] = wl["status"]["conditions"][:1]
                wl["status"]["admissionChecks"][0].update(state="Pending", message="")
                pods = 0
            stored = self.put(k.WORKLOADS, "workloads", wl)
            key = f"{stored['metadata']['namespace']}/{stored['metadata']['name']}"
            self.pods_of[key] = []
            for p in self.pods_for(stored, pods, per):
                self.put(k.PODS, "pods", p)
                self.pods_of[key].append(f"{p['metadata']['namespace']}/{p['metadata']['name']}")

    def draw_kw(self) -> float:
        gpus = sum(GPUS_PER_NODE - f for f in self.free.values())
        return RACKS * IDLE_KW + gpus * KW_PER_GPU

    def workloads(self) -> Iterator[tuple[str, Obj]]:
        for (plural, ns, name), obj in list(self.api.objects.items()):
            if plural == "workloads":
                yield f"{ns}/{name}", obj

    def kueue(self) -> int:
        """Kueue's stand-in, one pass: evict what m2g shed (pods deleted, quota released, the
        check back to Pending), reserve quota for what it restored, admit what m2g answered
        Ready (new pods). Returns the changes made."""
        changes = 0
        now = stamp(datetime.now(UTC))
        for key, wl in self.workloads():
            ns, name = key.split("/")
            status = wl.setdefault("status", {})
            conds = {c["type"]: c for c in status.get("conditions", [])}
            is_admitted = conds.get("Admitted", {}).get("status") == "True"
            checks = status.get("admissionChecks") or []
            ready = any(c.get("name") == CHECK and c.get("state") == "Ready" for c in checks)
            if wl["spec"].get("active") is False and is_admitted:
                for pk in self.pods_of.pop(key, []):
                    pns, pname = pk.split("/")
                    pod = self.api.objects.pop(("pods", pns, pname), None)
                    if pod is not None:
                        host = pod["spec"]["nodeName"]
                        self.free[host] += int(pod["spec"]["containers"][0]["resources"]
                                               ["requests"]["nvidia.com/gpu"])
                        self.deliver("pods", "DELETED", pod)
                status.pop("admission", None)
                status["conditions"] = [
                    {"type": "QuotaReserved", "status": "False", "reason": "Pending",
                     "message": "The workload is deactivated", "lastTransitionTime": now,
                     "observedGeneration": 1},
                    {"type": "Admitted", "status": "False", "reason": "NoReservation",
                     "message": "The workload has no reservation", "lastTransitionTime": now,
                     "observedGeneration": 1},
                    {"type": "Evicted", "status": "True", "reason": "InactiveWorkload",
                     "message": "The workload is deactivated", "lastTransitionTime": now,
                     "observedGeneration": 1}]
                status["admissionChecks"] = [{"name": CHECK, "state": "Pending",
                                              "message": "Reset to Pending after eviction",
                                              "lastTransitionTime": now}]
            elif wl["spec"].get("active", True) and not is_admitted \
                    and conds.get("QuotaReserved", {}).get("status") != "True":
                status["conditions"] = [
                    {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved",
                     "message": f"Quota reserved in ClusterQueue {CQ}",
                     "lastTransitionTime": now, "observedGeneration": 1}]
                status["admission"] = copy.deepcopy(self.wl_t["status"]["admission"])
                status["admission"]["clusterQueue"] = CQ
            elif not is_admitted and ready:
                per = int(wl["spec"]["podSets"][0]["template"]["spec"]["containers"][0]
                          ["resources"]["requests"]["nvidia.com/gpu"])
                pods = self.pods_for(wl, int(wl["spec"]["podSets"][0]["count"]), per)
                status["conditions"] = [*status.get("conditions", [])[:1], {
                    "type": "Admitted", "status": "True", "reason": "Admitted",
                    "message": "The workload is admitted", "lastTransitionTime": now,
                    "observedGeneration": 1}]
                self.pods_of[key] = []
                for p in pods:
                    self.put(k.PODS, "pods", p)
                    self.pods_of[key].append(f"{ns}/{p['metadata']['name']}")
            else:
                continue
            changes += 1
            self.api.put(k.WORKLOADS, wl)
            self.deliver("workloads", "MODIFIED", self.api.objects[("workloads", ns, name)])
        # m2g's own writes, as the watch delivers them after the write's answer
        for plural, ns, name in sorted(self.api.touched):
            cache = {"workloads": "workloads", "gridevents": "grid_events",
                     "clusterqueues": "cluster_queues"}.get(plural)
            obj = self.api.objects.get((plural, ns, name))
            if cache and obj is not None:
                self.deliver(cache, "MODIFIED", obj)
        self.api.touched.clear()
        return changes


def decisions(plan: Any, digest: Any) -> None:
    """Fold a plan's sheds and restores (workload, active) and check answers (workload,
    state) into ``digest``: the same objects give the same digest whatever their memory."""
    if plan is None:
        return
    digest.update(repr(sorted((s.namespace, s.name, s.active) for s in plan.sheds)).encode())
    digest.update(repr(sorted((c.namespace, c.name, str(c.state)) for c in plan.checks))
                  .encode())


def shed(world: World) -> int:
    return sum(1 for _, wl in world.workloads() if wl["spec"].get("active") is False)


async def run(args: argparse.Namespace) -> None:
    api = Api()
    cluster = K8sCluster(api, readings=kit.modelled_power(), instance="m2g-bench")

    async def no_kai(*_: Any) -> bool:
        return False

    cluster.kai.probe = no_kai  # type: ignore[method-assign]
    policy_dir = Path(tempfile.mkdtemp(prefix="m2g-mem-"))
    for name, text in kit.standard_policies("bench").items():
        (policy_dir / name).write_text(text)
    config = PlannerConfig(check_name=CHECK, ramp_kw_per_second=100_000.0,
                           max_step_kw=2 * args.shed_kw, power_caps=False, min_shed_seconds=0.0)
    manager = Manager(cluster, PolicyStore(make_runtime()), Metrics(), config=config,
                      policy_dir=policy_dir, freeze_collector=True)
    if args.tracemalloc:
        tracemalloc.start(args.frames)
    t0 = time.process_time()
    print(f"start: RSS {rss_mib():.0f} MiB", flush=True)
    world = World(api, cluster)
    world.setup(args.workloads, args.pending)
    for _ in range(3 if not args.pending else 40):
        await manager.reconcile()
        world.kueue()
    await cluster.applier.drain()
    print(f"setup: {len(cluster.caches['nodes'])} nodes, {len(cluster.caches['workloads'])} "
          f"workloads, {len(cluster.caches['pods'])} pods; RSS {rss_mib():.0f} MiB "
          f"(CPU {time.process_time() - t0:.1f} s); {heap()}", flush=True)
    base = None
    if args.tracemalloc:
        gc.collect()
        base = tracemalloc.take_snapshot()
    digest = hashlib.sha256()
    for rnd in range(args.rounds):
        t1 = time.process_time()
        limit = world.draw_kw() - args.shed_kw
        event = kit.grid_event(f"ev-{rnd}", datetime.now(UTC) - timedelta(seconds=1), 30, limit)
        world.put(k.GRID_EVENTS, "grid_events", event)
        for _ in range(args.reconciles_per_round):
            decisions(await manager.reconcile(), digest)
            world.kueue()
        during = shed(world)
        gone = api.objects.pop(("gridevents", "", f"ev-{rnd}"))
        world.deliver("grid_events", "DELETED", gone)
        for _ in range(args.reconciles_per_round):
            decisions(await manager.reconcile(), digest)
            world.kueue()
        await cluster.applier.drain()
        print(f"round {rnd}: shed {during}, still shed {shed(world)}, "
              f"{len(cluster.caches['pods'])} pods; RSS {rss_mib():.0f} MiB, peak "
              f"{hwm_mib():.0f} MiB; {heap()}; {len(cluster.applier.records)} applier records "
              f"(CPU {time.process_time() - t1:.1f} s)", flush=True)
    print(f"decisions (sheds, restores, check answers) digest: {digest.hexdigest()[:16]}")
    stats = gc.get_stats()
    frozen = gc.get_freeze_count()
    before = rss_mib()
    gc.unfreeze()
    found = gc.collect()
    print(f"full collections during the run: {stats[2]['collections']}; frozen objects "
          f"{frozen}; a full collection now frees {found} objects: RSS {before:.0f} -> "
          f"{rss_mib():.0f} MiB", flush=True)
    if base is not None:
        gc.collect()
        end = tracemalloc.take_snapshot()
        print(f"\ngrowth since the setup, by line (top {args.top}):")
        for stat in end.compare_to(base, "lineno")[:args.top]:
            print(f"  {stat}")
        print(f"\nlargest at the end, by line (top {args.top}):")
        for stat in end.statistics("lineno")[:args.top]:
            print(f"  {stat}")
        print(f"\ntraced: {sum(s.size for s in end.statistics('filename')) / 2**20:.1f} MiB")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workloads", type=int, default=2000)
    p.add_argument("--shed-kw", type=float, default=500.0)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--reconciles-per-round", type=int, default=30,
                   help="reconciles while the event lasts, and as many after it")
    p.add_argument("--pending", type=int, default=0,
                   help="workloads that start with m2g's check Pending (answered in the setup)")
    p.add_argument("--tracemalloc", action="store_true")
    p.add_argument("--frames", type=int, default=1)
    p.add_argument("--top", type=int, default=15)
    args = p.parse_args()
    asyncio.run(run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
