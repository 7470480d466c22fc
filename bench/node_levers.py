"""Node levers' cost per reconcile on a 100-rack factory (1,800 nodes, 2,000 admitted
workloads with 4,000 running pods, a window on 10 racks starting in 5 min): the snapshot (with
the workload → node placements it builds from pods), the placements alone, and the two
planner parts (taints, drains).

Run: ``.venv/bin/python bench/node_levers.py``. A benchmark script: it prints medians of 20
runs and asserts nothing about time.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from m2g.k8s import build as kb
from m2g.k8s import convert as cv
from m2g.planner.config import PlannerConfig
from m2g.planner.inputs import InputBuilder
from m2g.planner.nodes import drain_actions, taint_updates

NOW = datetime(2026, 11, 29, 16, 0, tzinfo=UTC)
RACKS, NODES_PER_RACK, WORKLOADS, PODS_PER_WORKLOAD = 100, 18, 2000, 2


def node(rack: int, i: int) -> dict[str, Any]:
    gpus = {"nvidia.com/gpu": "4"}
    return {"metadata": {"name": f"n{rack}-{i}", "resourceVersion": "1",
                         "labels": {"network.topology.nvidia.com/accelerator": f"rack-{rack}"}},
            "status": {"capacity": gpus, "allocatable": gpus,
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def objects() -> kb.ClusterObjects:
    nodes = {f"n{r}-{i}": node(r, i) for r in range(RACKS) for i in range(NODES_PER_RACK)}
    workloads, pods = {}, {}
    for w in range(WORKLOADS):
        workloads[f"t/w{w}"] = {
            "metadata": {"name": f"w{w}", "namespace": "t", "resourceVersion": "1",
                         "ownerReferences": [{"uid": f"job-{w}"}]},
            "spec": {"podSets": [{"name": "main", "count": PODS_PER_WORKLOAD}]},
            "status": {"conditions": [{"type": "Admitted", "status": "True"}]}}
        for p in range(PODS_PER_WORKLOAD):
            n = (w * PODS_PER_WORKLOAD + p) % len(nodes)
            pods[f"t/p{w}-{p}"] = {
                "metadata": {"uid": f"pod-{w}-{p}", "ownerReferences": [{"uid": f"job-{w}"}]},
                "spec": {"nodeName": f"n{n // NODES_PER_RACK}-{n % NODES_PER_RACK}",
                         "containers": [{"resources": {"requests": {"nvidia.com/gpu": "2"}}}]},
                "status": {"phase": "Running"}}
    window = {"metadata": {"name": "mw"}, "spec": {
        "start": "2026-11-29T16:05:00Z", "end": "2026-11-29T18:00:00Z",
        "scope": {"racks": [f"rack-{r}" for r in range(10)]}}}
    return kb.ClusterObjects(nodes=nodes, pods=pods, workloads=workloads,
                             maintenance_windows={"mw": window})


def median_ms(f: Callable[[], object], runs: int = 20) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def main() -> None:
    objs = objects()
    memo = kb.SnapshotMemo()
    snap = kb.build_snapshot(objs, None, NOW, memo=memo)
    builder, cfg = InputBuilder(snap), PlannerConfig()
    rows = [
        ("build_snapshot (memo warm)", lambda: kb.build_snapshot(objs, None, NOW, memo=memo)),
        ("placements alone", lambda: cv.placements(objs.pods.values(),
                                                   objs.workloads.values())),
        (f"taint_updates ({len(taint_updates(builder, cfg))} taints)",
         lambda: taint_updates(builder, cfg)),
        (f"drain_actions ({len(drain_actions(builder, cfg))} drains)",
         lambda: drain_actions(builder, cfg)),
    ]
    for label, f in rows:
        print(f"{label:40s} {median_ms(f):8.1f} ms")


if __name__ == "__main__":
    main()
