"""A generated AI factory at any scale, as raw Kubernetes objects: the input of bench/scale.py
(issue 14) and of the 100-rack differential test (tests/unit/test_scale_decisions.py).

GB300 NVL72 racks (18 nodes of 4 GPUs; blocks of 8 racks, power domains of 16, one
ResourceFlavor per power domain, ClusterQueues of 8 teams with up to 16 flavors each, Kueue's
limit per resource group), and a mix like a busy site's: 60 % of the workloads running (pods
bound, about 85 % of the GPUs allocated), 40 % with quota reserved and m2g's check Pending, an
active grid event (a 30 % import-capacity cut), two hot racks (inlet 1 °C under the 32 °C
limit), 1 % of the nodes with a GPU XID condition. Deterministic for a seed.
"""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from m2g.k8s.build import ClusterObjects
from m2g.model.labels import TopologyLabels
from m2g.signals.readings import RackReadings, Readings, SignalReading

NOW = datetime(2026, 11, 30, 14, 0, tzinfo=UTC)
NODES_PER_RACK, GPUS_PER_NODE = 18, 4
RACKS_PER_BLOCK, RACKS_PER_DOMAIN = 8, 16
TEAMS, FLAVORS_PER_QUEUE = 8, 16  # Kueue allows 16 flavors per resource group
CHECK = "m2g-policy"
#: The synthetic site names its power domains with a label of its own (no standard one exists):
#: build its snapshots with ``labels=LABELS``.
POWER_DOMAIN_LABEL = "example.com/power-domain"
LABELS = TopologyLabels(power_domain=POWER_DOMAIN_LABEL)
KINDS = ("training", "fine-tuning", "inference", "batch", "benchmark", "data-processing",
         "agentic")


def rfc3339(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Layout:
    racks: int

    def rack(self, r: int) -> str:
        return f"rack-{r:04d}"

    def block(self, r: int) -> str:
        return f"block-{r // RACKS_PER_BLOCK:03d}"

    def domain(self, r: int) -> str:
        return f"pd-{r // RACKS_PER_DOMAIN:03d}"

    @property
    def domains(self) -> list[str]:
        return sorted({self.domain(r) for r in range(self.racks)})


def node_obj(lay: Layout, r: int, i: int, healthy: bool) -> dict[str, Any]:
    gpus = {"nvidia.com/gpu": str(GPUS_PER_NODE)}
    conds = [{"type": "Ready", "status": "True"}]
    if not healthy:
        conds.append({"type": "GpuXidError", "status": "True"})
    return {"metadata": {"name": f"{lay.rack(r)}-n{i:02d}", "resourceVersion": "1",
                         "labels": {"network.topology.nvidia.com/accelerator": lay.rack(r),
                                    "network.topology.nvidia.com/block": lay.block(r),
                                    POWER_DOMAIN_LABEL: lay.domain(r),
                                    "nvidia.com/gpu.clique": f"c0ffee.{r}",
                                    "kubernetes.io/hostname": f"{lay.rack(r)}-n{i:02d}"}},
            "status": {"capacity": gpus, "allocatable": gpus, "conditions": conds}}


def shape(rng: random.Random, big: bool) -> tuple[int, int]:
    """(pods, GPUs per pod): mostly small jobs, some multi-node ones when ``big``."""
    if big and rng.random() < 0.25:
        return rng.choice((2, 4, 9, 18)), 4
    return 1, rng.choice((1, 1, 1, 2, 4))


def workload_obj(i: int, rng: random.Random, pods: int, per_pod: int, running: bool,
                 cq: str, ns: str, lq: str) -> dict[str, Any]:
    kind = KINDS[i % len(KINDS)]
    tier = rng.choice((0, 1, 1, 2, 3))
    created = NOW - timedelta(seconds=rng.randrange(30, 7200))
    labels = {"m2g.io/workload-kind": kind, "m2g.io/flex-tier": str(tier),
              "m2g.io/expected-runtime-seconds": str(rng.choice((1800, 3600, 14400, 86400))),
              "m2g.io/estimated-kw": f"{1.4 * pods * per_pod:.1f}",
              "kueue.x-k8s.io/queue-name": lq}
    annotations: dict[str, str] = {}
    if kind in ("training", "fine-tuning"):
        labels["m2g.io/checkpoint-interval-seconds"] = "1800"
        annotations["m2g.io/last-checkpoint-time"] = rfc3339(
            NOW - timedelta(seconds=rng.randrange(0, 3600)))
    conds = [{"type": "QuotaReserved", "status": "True",
              "lastTransitionTime": rfc3339(created)}]
    if running:
        conds.append({"type": "Admitted", "status": "True",
                      "lastTransitionTime": rfc3339(created + timedelta(seconds=20))})
    return {
        "metadata": {"name": f"job-{i:06d}", "namespace": ns, "resourceVersion": str(1000 + i),
                     "uid": f"wl-{i}", "creationTimestamp": rfc3339(created),
                     "ownerReferences": [{"uid": f"job-{i}"}],
                     "labels": labels, "annotations": annotations},
        "spec": {"queueName": lq, "priority": rng.randrange(0, 1000), "podSets": [{
            "name": "main", "count": pods, "template": {"spec": {"containers": [{
                "name": "c", "resources": {"requests": {"nvidia.com/gpu": str(per_pod)}}}]}}}]},
        "status": {"conditions": conds,
                   "admission": {"clusterQueue": cq, "podSetAssignments": [{"name": "main"}]},
                   "admissionChecks": [{"name": CHECK, "state": "Ready" if running else "Pending",
                                        "message": ""}]},
    }


def generate(racks: int, workloads: int, seed: int = 14) -> tuple[ClusterObjects, Readings]:
    """(ClusterObjects, Readings) of a factory of ``racks`` racks and ``workloads`` workloads."""
    rng = random.Random(seed)
    lay = Layout(racks)
    nodes: dict[str, dict[str, Any]] = {}
    for r in range(racks):
        for i in range(NODES_PER_RACK):
            o = node_obj(lay, r, i, healthy=rng.random() > 0.01)
            nodes[o["metadata"]["name"]] = o
    names = sorted(nodes)
    domains = lay.domains
    chunks = [domains[k:k + FLAVORS_PER_QUEUE] for k in range(0, len(domains), FLAVORS_PER_QUEUE)]
    per_domain_gpus = RACKS_PER_DOMAIN * NODES_PER_RACK * GPUS_PER_NODE
    flavors = {f"gb300-{d}": {"metadata": {"name": f"gb300-{d}"},
                              "spec": {"nodeLabels": {POWER_DOMAIN_LABEL: d}}} for d in domains}
    cqs, lqs = {}, {}
    for t in range(TEAMS):
        for c, chunk in enumerate(chunks):
            name = f"team-{t}-{c}"
            cqs[name] = {"metadata": {"name": name, "annotations": {}}, "spec": {
                "cohortName": "all", "stopPolicy": "None", "resourceGroups": [{
                    "coveredResources": ["nvidia.com/gpu"], "flavors": [
                        {"name": f"gb300-{d}", "resources": [{
                            "name": "nvidia.com/gpu",
                            "nominalQuota": str(per_domain_gpus // TEAMS)}]}
                        for d in chunk]}]},
                "status": {"pendingWorkloads": 0}}
            lqs[f"team-{t}/lq-{c}"] = {"metadata": {"name": f"lq-{c}", "namespace": f"team-{t}"},
                                      "spec": {"clusterQueue": name}}
    # Running work fills ~85 % of the GPUs; the rest of the workloads wait with m2g's check.
    running = workloads * 6 // 10
    capacity = len(names) * GPUS_PER_NODE
    free = {n: GPUS_PER_NODE for n in names}
    budget = int(capacity * 0.85)
    wls: dict[str, dict[str, Any]] = {}
    pods: dict[str, dict[str, Any]] = {}
    cursor, run_left = 0, running
    hist = [0] * GPUS_PER_NODE + [len(names)]  # nodes by free GPUs
    stride = next(k for k in (7, 11, 13, 17, 19, 23) if math.gcd(k, len(names)) == 1)
    for i in range(workloads):
        run = i % 10 < 6 and run_left > 0
        pods_n, per_pod = shape(rng, big=not run or budget > run_left * 8)
        if run:  # keep every running workload placeable: at most the average GPUs left
            fair = max(1, budget // run_left)
            per_pod = min(per_pod, fair)
            pods_n = min(pods_n, max(1, fair // per_pod))
            run_left -= 1
        t = i % TEAMS
        c = (i // TEAMS) % len(chunks)
        o = workload_obj(i, rng, pods_n, per_pod, run, f"team-{t}-{c}", f"team-{t}", f"lq-{c}")
        wls[f"team-{t}/{o['metadata']['name']}"] = o
        if not run:
            continue
        budget -= pods_n * per_pod
        for p in range(pods_n):
            if not any(hist[per_pod:]):  # no node has room: the pod stays unbound
                continue
            for _ in range(len(names)):  # spread over the racks: `stride` nodes further
                cursor += stride
                host = names[cursor % len(names)]
                if free[host] >= per_pod:
                    break
            else:
                continue
            hist[free[host]] -= 1
            free[host] -= per_pod
            hist[free[host]] += 1
            pods[f"team-{t}/{o['metadata']['name']}-{p}"] = {
                "metadata": {"name": f"{o['metadata']['name']}-{p}", "namespace": f"team-{t}",
                             "uid": f"pod-{i}-{p}", "resourceVersion": str(1 + p),
                             "ownerReferences": [{"uid": f"job-{i}"}]},
                "spec": {"nodeName": host, "containers": [{"resources": {"requests": {
                    "nvidia.com/gpu": str(per_pod)}}}]},
                "status": {"phase": "Running"}}
    rack_kw = {lay.rack(r): 80.0 + 40.0 * rng.random() for r in range(racks)}
    draw = sum(rack_kw.values())
    pds = {"site": {"metadata": {"name": "site-big"},
                    "spec": {"level": "Site", "budgetKw": draw * 1.1, "inletLimitC": 32.0}}}
    for d in domains:
        pds[d] = {"metadata": {"name": d}, "spec": {
            "budgetKw": RACKS_PER_DOMAIN * 132.0 * 0.9, "rackCapKw": 132.0, "inletLimitC": 32.0,
            "rackSelector": {"matchLabels": {POWER_DOMAIN_LABEL: d}}}}
    event = {"metadata": {"name": "dr-1"}, "spec": {
        "eventID": "dr-1", "programName": "utility-dr", "targetReductionPercent": 30,
        "intervals": [{"start": rfc3339(NOW - timedelta(minutes=5)), "duration": "PT2H",
                       "payload": {"type": "IMPORT_CAPACITY_LIMIT", "value": draw * 0.7}}]},
        "status": {"observedBaselineKw": draw}}
    hot = {lay.rack(racks // 3), lay.rack(2 * racks // 3)}

    def sig(v: float) -> SignalReading:
        return SignalReading.of(v, 10.0, 120.0)

    rack_readings = {name: RackReadings(name, sig(kw), sig(31.0 if name in hot else
                                                           24.0 + 4 * rng.random()), sig(30.0))
                     for name, kw in rack_kw.items()}
    readings = Readings(now=NOW.timestamp(), nodes={}, racks=rack_readings, domains={},
                        status={})
    objs = ClusterObjects(
        nodes=nodes, pods=pods, workloads=wls, local_queues=lqs, cluster_queues=cqs,
        resource_flavors=flavors,
        admission_checks={CHECK: {"metadata": {"name": CHECK},
                                  "spec": {"controllerName": "m2g.io/policy"}}},
        power_domains=pds, grid_events={"dr-1": event})
    return objs, readings


def tick(objs: ClusterObjects, seconds: int, changed: int = 300, seed: int = 15
         ) -> ClusterObjects:
    """The same factory a controller tick later, as the watch caches would hold it:
    ``changed`` workloads have a new resourceVersion — every third of them running reports a
    checkpoint at ``NOW`` + ``seconds``, the others' Kueue priority changed (the mix a tick
    brings: progress reports and a few edits) — and nothing else changed (the caller's
    snapshot moves its clock). New mappings and objects: ``objs`` is unchanged."""
    rng = random.Random(seed + seconds)
    workloads = dict(objs.workloads)
    for n, key in enumerate(rng.sample(sorted(workloads), changed)):
        old = workloads[key]
        meta = {**old["metadata"], "resourceVersion": f"{old['metadata']['resourceVersion']}"
                f"-{seconds}", "annotations": dict(old["metadata"].get("annotations", {}))}
        spec = dict(old["spec"])
        if n % 3 == 0 and "m2g.io/last-checkpoint-time" in meta["annotations"]:
            meta["annotations"]["m2g.io/last-checkpoint-time"] = rfc3339(
                NOW + timedelta(seconds=seconds))
        else:
            spec["priority"] = rng.randrange(0, 1000)
        workloads[key] = {**old, "metadata": meta, "spec": spec}
    return dataclasses.replace(objs, workloads=workloads)


def plan_record(plan: Any) -> dict[str, Any]:
    """A Plan as plain, ordered data (every decision and its message), for comparing the plans
    of two implementations: checks by workload, the rest in the plan's own order."""
    def rows(items: Any) -> list[dict[str, Any]]:
        return [dict(vars(x)) if not hasattr(x, "__slots__") else
                {k: getattr(x, k) for k in x.__slots__} for x in items]

    checks = sorted(rows(plan.checks), key=lambda c: (c["namespace"], c["name"]))
    for c in checks:
        c["state"] = str(c["state"])
        c["pod_set_updates"] = list(c["pod_set_updates"])
    out: dict[str, Any] = {"checks": checks}
    for name in ("quotas", "stops", "sheds", "weights", "taints", "caps", "node_limits"):
        out[name] = rows(getattr(plan, name))
    for t in out["taints"]:
        t["effect"] = str(t["effect"])
    out["notes"] = list(plan.notes)
    return out
