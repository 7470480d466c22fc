"""The decision core at scale: one reconcile on generated factories of 100 / 400 / 1,400 GB300
NVL72 racks with 2,000 / 20,000 / 100,000 workloads (issue 14).

Offline, deploy/policies, a mix like a busy site's: 60 % of the workloads running (pods bound,
so nodes have their GPUs allocated), 40 % with quota reserved and m2g's check Pending, an
active grid event (a 30 % import-capacity cut: shedding has work to do), two hot racks (inlet
over the limit), a few unhealthy nodes, one ResourceFlavor per power domain, ClusterQueues of
eight teams with quotas on those flavors.

Each size runs in its own subprocess (``ru_maxrss`` is per process) under an address-space
limit (``--mem-limit-gib``, RLIMIT_AS), so a blow-up fails cleanly instead of taking the
machine. It reports, wall and CPU (``time.process_time``):

* snapshot: ``build_snapshot`` from the raw objects, cold (no memo) and warm (memo, 5 s later);
* plan parts: each part of ``make_plan`` on a fresh snapshot, the evaluator warm (steady state:
  the controller keeps its Evaluator, every reconcile brings a new snapshot);
* make_plan: the whole reconcile on another fresh snapshot;
* RSS: after the raw objects were generated, and the process's peak;
* the growth exponent between consecutive sizes: d log(cost) / d log(workloads).

Run: ``make bench-scale`` or ``.venv/bin/python bench/scale.py --sizes 100,400``. A script:
it prints figures and asserts nothing about time.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import math
import random
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
NOW = datetime(2026, 11, 30, 14, 0, tzinfo=UTC)
WORKLOADS = {100: 2_000, 400: 20_000, 1_400: 100_000}
NODES_PER_RACK, GPUS_PER_NODE = 18, 4
RACKS_PER_BLOCK, RACKS_PER_DOMAIN = 8, 16
TEAMS, FLAVORS_PER_QUEUE = 8, 16  # Kueue allows 16 flavors per resource group
CHECK = "m2g-policy"
KINDS = ("training", "fine-tuning", "inference", "batch", "benchmark", "data-processing",
         "agentic")


def rfc3339(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


# ---- the generator ------------------------------------------------------------------------

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
                         "labels": {"m2g.io/rack": lay.rack(r), "m2g.io/block": lay.block(r),
                                    "m2g.io/power-domain": lay.domain(r),
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


def generate(racks: int, workloads: int, seed: int = 14) -> tuple[Any, Any]:
    """(ClusterObjects, Readings) of a factory of ``racks`` racks and ``workloads`` workloads."""
    from m2g.k8s.convert import ClusterObjects
    from m2g.signals.readings import RackReadings, Readings, SignalReading

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
                              "spec": {"nodeLabels": {"m2g.io/power-domain": d}}} for d in domains}
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
            for _ in range(len(names)):
                host = names[cursor % len(names)]
                if free[host] >= per_pod:
                    break
                cursor += 1
            else:
                continue
            free[host] -= per_pod
            pods[f"team-{t}/{o['metadata']['name']}-{p}"] = {
                "metadata": {"name": f"{o['metadata']['name']}-{p}", "namespace": f"team-{t}",
                             "uid": f"pod-{i}-{p}", "ownerReferences": [{"uid": f"job-{i}"}]},
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
            "rackSelector": {"matchLabels": {"m2g.io/power-domain": d}}}}
    event = {"metadata": {"name": "dr-1"}, "spec": {
        "eventID": "dr-1", "programName": "utility-dr", "targetReductionPercent": 30,
        "intervals": [{"start": rfc3339(NOW - timedelta(minutes=5)), "duration": "PT2H",
                       "payload": {"type": "IMPORT_CAPACITY_LIMIT", "value": draw * 0.7}}]},
        "status": {"observedBaselineKw": draw}}
    hot = {lay.rack(racks // 3), lay.rack(2 * racks // 3)}

    def sig(v: float) -> SignalReading:
        return SignalReading.of(v, 10.0, 120.0)

    rack_readings = {name: RackReadings(name, sig(kw), sig(33.5 if name in hot else
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


# ---- one size, in this process --------------------------------------------------------------

def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def timed(f: Callable[[], Any]) -> tuple[Any, float, float]:
    w0, c0 = time.perf_counter(), time.process_time()
    out = f()
    return out, time.perf_counter() - w0, time.process_time() - c0


def run_size(racks: int, workloads: int, policies: Path, engine: str,
             out: dict[str, Any]) -> dict[str, Any]:
    """Fill ``out`` as it goes, so a MemoryError still reports what was measured before."""
    from m2g.k8s import convert as cv
    from m2g.planner import plan as planner
    from m2g.planner.admission import check_updates
    from m2g.planner.capacity import capacity_updates
    from m2g.planner.config import PlannerConfig
    from m2g.planner.fairness import weight_updates
    from m2g.planner.inputs import InputBuilder
    from m2g.planner.kai import kai_updates
    from m2g.planner.nodes import drain_actions, taint_updates
    from m2g.planner.shedding import shed_actions
    from m2g.policy import Evaluator, load_dir

    (objs, readings), out["generate_s"], _ = timed(lambda: generate(racks, workloads))
    gc.collect()
    out["raw_rss_mib"] = rss_mib()
    ev = Evaluator(load_dir(policies, engine))
    cfg = PlannerConfig()
    memo = cv.SnapshotMemo()

    def snap_at(seconds: int) -> Any:
        return cv.build_snapshot(objs, readings, NOW + timedelta(seconds=seconds), memo=memo)

    _, out["snapshot_cold_wall"], out["snapshot_cold_cpu"] = timed(
        lambda: cv.build_snapshot(objs, readings, NOW))
    snap_at(0)
    snap, out["snapshot_warm_wall"], out["snapshot_warm_cpu"] = timed(lambda: snap_at(5))
    pending = sum(1 for w in snap.workloads if w.check_state is not None
                  and w.check_state.value == "Pending")
    out["pending"], out["domains"] = pending, len(InputBuilder(snap).v.domains)
    first, out["plan_first_wall"], out["plan_first_cpu"] = timed(
        lambda: planner.make_plan(snap, ev, cfg))
    out["decisions"] = {"checks": len(first.checks), "quotas": len(first.quotas),
                        "sheds": len(first.sheds), "stops": len(first.stops)}
    snap = snap_at(10)
    b = InputBuilder(snap)
    sheds: list[Any] = []
    parts: list[tuple[str, Callable[[], Any]]] = [
        ("capacity", lambda: capacity_updates(ev, b, cfg)),
        ("shedding", lambda: sheds.extend(shed_actions(ev, b, cfg)[0])),
        ("kai", lambda: kai_updates(snap, cfg)),
        ("drains", lambda: drain_actions(b, cfg, frozenset(
            f"{a.namespace}/{a.name}" for a in sheds))),
        ("admission", lambda: check_updates(ev, b, cfg)),
        ("fairness", lambda: weight_updates(ev, b)),
        ("taints", lambda: taint_updates(b, cfg)),
    ]
    out["parts"] = {}
    for name, f in parts:
        _, wall, cpu = timed(f)
        out["parts"][name] = {"wall": wall, "cpu": cpu}
    snap = snap_at(15)
    _, out["plan_wall"], out["plan_cpu"] = timed(lambda: planner.make_plan(snap, ev, cfg))
    out["peak_rss_mib"] = peak_mib()
    return out


# ---- the driver -----------------------------------------------------------------------------

def child(args: argparse.Namespace) -> int:
    limit = int(args.mem_limit_gib * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    size = args.workloads or WORKLOADS.get(args.child, args.child * 20)
    res: dict[str, Any] = {"racks": args.child, "workloads": size}
    try:
        run_size(args.child, res["workloads"], args.policies, args.engine, res)
    except MemoryError:
        res["error"] = f"MemoryError under {args.mem_limit_gib:g} GiB"
    print(json.dumps(res))
    return 0


def exponent(a: dict[str, Any], b: dict[str, Any], key: str) -> str:
    try:
        return f"{math.log(b[key] / a[key]) / math.log(b['workloads'] / a['workloads']):.2f}"
    except (KeyError, ValueError, ZeroDivisionError):
        return "—"


def report(results: list[dict[str, Any]]) -> None:
    ok = [r for r in results if "error" not in r]
    print("\n| size | pending | domains | snapshot cold / warm (wall, CPU) | make_plan first "
          "| make_plan (wall / CPU) | raw RSS | peak RSS |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        if "error" in r:
            done = ", ".join(f"{k} {v:.2f}" for k, v in r.items()
                             if isinstance(v, float) and k.endswith(("wall", "cpu", "mib")))
            print(f"| {r['racks']} racks | {r['error']} | {done} | | | | | |")
            continue
        print(f"| {r['racks']} racks / {r['workloads']:,} | {r['pending']:,} | {r['domains']:,} "
              f"| {r['snapshot_cold_wall']:.2f} s ({r['snapshot_cold_cpu']:.2f}) / "
              f"{r['snapshot_warm_wall']:.2f} s ({r['snapshot_warm_cpu']:.2f}) "
              f"| {r['plan_first_wall']:.2f} s ({r['plan_first_cpu']:.2f} CPU) "
              f"| {r['plan_wall']:.3f} s / {r['plan_cpu']:.3f} s "
              f"| {r['raw_rss_mib']:.0f} MiB | {r['peak_rss_mib']:.0f} MiB |")
    if ok:
        names = list(ok[0]["parts"])
        print("\nplan parts, wall / CPU seconds (steady state: warm evaluator, new snapshot)\n")
        print("| size | " + " | ".join(names) + " |")
        print("| --- |" + " --- |" * len(names))
        for r in ok:
            print(f"| {r['racks']} racks | " + " | ".join(
                f"{r['parts'][n]['wall']:.3f} / {r['parts'][n]['cpu']:.3f}" for n in names) + " |")
        for r in ok:
            print(f"decisions at {r['racks']} racks: {r['decisions']}")
    for a, b in itertools.pairwise(ok):
        print(f"growth {a['racks']}→{b['racks']} racks (per ×workloads): make_plan CPU "
              f"{exponent(a, b, 'plan_cpu')}, snapshot warm CPU "
              f"{exponent(a, b, 'snapshot_warm_cpu')}, peak RSS {exponent(a, b, 'peak_rss_mib')}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--sizes", default="100,400,1400", help="racks, comma-separated")
    ap.add_argument("--workloads", type=int, default=0,
                    help="workloads (default: 2,000 / 20,000 / 100,000 for 100 / 400 / 1,400)")
    ap.add_argument("--policies", type=Path, default=ROOT / "deploy" / "policies")
    ap.add_argument("--engine", default="cel-expr-python")
    ap.add_argument("--mem-limit-gib", type=float, default=8.0,
                    help="address-space limit of each size's subprocess")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)
    results = []
    for size in (int(s) for s in args.sizes.split(",") if s):
        cmd = [sys.executable, __file__, "--child", str(size), "--policies", str(args.policies),
               "--engine", args.engine, "--mem-limit-gib", str(args.mem_limit_gib)]
        if args.workloads:
            cmd += ["--workloads", str(args.workloads)]
        print(f"{size} racks ...", file=sys.stderr, flush=True)
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        line = (proc.stdout.strip().splitlines() or [""])[-1]
        try:
            results.append(json.loads(line))
        except json.JSONDecodeError:
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            results.append({"racks": size, "error": f"exit {proc.returncode}: {tail[:120]}"})
    report(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
