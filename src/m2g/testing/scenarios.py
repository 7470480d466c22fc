"""Synthetic factories and trace-driven workloads, for tests, benchmarks and the demo.

Workloads come from the Alibaba openb trace (data/openb; Weng et al., "Beware of
Fragmentation", USENIX ATC '23): each pod row gives a GPU count, a QoS class and a runtime. The
trace has no multi-node jobs, so each row is scaled into a gang by a deterministic factor (1, 1,
1, 2, 4, 9, 18 or 36 pods of its size, chosen by a hash of the pod name) to reach NVL72-sized
jobs. QoS maps to flex tier (LS and Guaranteed → 0, Burstable → 1, BE → 2 or 3). The factory is
16 GB300 NVL72 racks in 4 blocks on 2 power domains, in one of four scenarios: normal, a grid
event, a hot rack, maintenance ahead.
"""

from __future__ import annotations

import csv
import hashlib
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

from m2g.model.factory import (
    FactorySnapshot,
    GridEvent,
    GridPayload,
    MaintenanceWindow,
    Node,
    PowerDomain,
    Rack,
    Reading,
    domain_views,
    grid_view,
    site_view,
)
from m2g.model.inputs import PolicyInput, QueueView, WorkloadKind, WorkloadView

#: The repository's data folder (data/, with each source's terms), or $M2G_DATA.
DATA = Path(os.environ.get("M2G_DATA") or Path(__file__).resolve().parents[3] / "data")
OPENB = DATA / "openb" / "openb_pod_list_default.csv"
SCENARIOS = ("normal", "grid-event", "hot-rack", "maintenance")
GANGS = (1, 1, 1, 2, 4, 9, 18, 36)
KINDS = (WorkloadKind.TRAINING, WorkloadKind.FINE_TUNING, WorkloadKind.INFERENCE,
         WorkloadKind.BATCH, WorkloadKind.BENCHMARK, WorkloadKind.DATA_PROCESSING,
         WorkloadKind.AGENTIC)
NOW = datetime(2026, 11, 29, 15, 30, tzinfo=UTC)


def _h(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=4).digest(), "big")


def workloads(n: int, trace: Path = OPENB) -> list[WorkloadView]:
    """``n`` workloads from the openb trace (cycled if n exceeds the trace)."""
    with trace.open() as f:
        rows = list(csv.DictReader(f))
    out = []
    for i in range(n):
        row = rows[i % len(rows)]
        h = _h(row["name"] + str(i))
        per_pod = max(1, int(row["num_gpu"]) or 1)
        pods = GANGS[h % len(GANGS)]
        tier = {"LS": 0, "Guaranteed": 0, "Burstable": 1}.get(row["qos"], 2 + h % 2)
        start = row["scheduled_time"] or row["creation_time"]
        runtime = max(60, int(row["deletion_time"]) - int(start or 0))
        kind = KINDS[h % len(KINDS)]
        out.append(WorkloadView(
            name=row["name"], namespace=f"team-{h % 5}", queue="default",
            cluster_queue=f"cq-{h % 5}", priority=(h >> 8) % 2000, kind=kind, flex_tier=tier,
            pod_sets=({"name": "main", "count": pods, "gpus_per_pod": per_pod},),  # type: ignore[arg-type]
            labels={"m2g.io/workload-kind": kind.value, "m2g.io/flex-tier": str(tier)},
            expected_runtime_seconds=min(runtime, 14 * 86400), wait_seconds=(h >> 4) % 7200,
            requeue_count=(h >> 12) % 4, estimated_kw=1.4 * per_pod * pods,
            checkpoint={"interval_seconds": 1800, "last_age_seconds": (h >> 6) % 3600},  # type: ignore[arg-type]
        ))
    return out


def factory(scenario: str) -> FactorySnapshot:
    """16 NVL72 racks, 4 blocks, 2 power domains, in one of four scenarios."""
    racks, nodes = [], []
    for r in range(16):
        name = f"rack-{r:02d}"
        hot = scenario == "hot-rack" and r == 3
        racks.append(Rack(name=name, block=f"block-{r // 4}", power_domain=f"pd-{r // 8}",
                          clique=f"7b968a6d.{r}", power_kw=Reading(95.0 + r, 5.0), cap_kw=132.0,
                          inlet_c=Reading(34.5 if hot else 27.0, 5.0), limit_c=35.0,
                          thermal_alarm=hot))
        for t in range(18):
            nodes.append(Node(name=f"{name}-n{t:02d}", rack=name, gpus_allocated=(r + t) % 5,
                              reasons=("GpuXid",) if (r, t) == (5, 7) else ()))
    windows: tuple[MaintenanceWindow, ...] = ()
    if scenario == "maintenance":
        windows = (MaintenanceWindow("mw-1", NOW + timedelta(hours=2), NOW + timedelta(hours=6),
                                     racks=("rack-08", "rack-09")),)
    events: tuple[GridEvent, ...] = ()
    if scenario == "grid-event":
        events = (GridEvent("dr-2026-11-29", NOW - timedelta(minutes=10), NOW + timedelta(hours=3),
                            program="utility-dr", payload=GridPayload.IMPORT_CAPACITY_LIMIT,
                            level=2, target_kw=1400.0, reduction_pct=30.0),)
    return FactorySnapshot(now=NOW, site="site-phx", site_budget_kw=2000.0, site_limit_c=35.0,
                           power_domains=(PowerDomain("pd-0", 1050.0), PowerDomain("pd-1", 1050.0)),
                           racks=tuple(racks), nodes=tuple(nodes), maintenance=windows,
                           grid_events=events)


def inputs(n: int, trace: Path = OPENB) -> list[PolicyInput]:
    """``n`` admission inputs: trace workloads spread over the four scenarios; inputs of one
    scenario and queue share their snapshot objects, so they batch."""
    scenarios = SCENARIOS
    base = {}
    for s in scenarios:
        snap = factory(s)
        base[s] = {"site": site_view(snap), "grid": grid_view(snap),
                   "domains": domain_views(snap), "now": snap.now}
    out = []
    queues: dict[tuple[int, str], QueueView] = {}
    for i, w in enumerate(workloads(n, trace)):
        q = queues.setdefault((i % 4, w.cluster_queue), QueueView(
            name=w.cluster_queue, nominal_gpus=576, used_gpus=(len(queues) * 97) % 576,
            pending_workloads=len(queues) * 3))
        out.append(PolicyInput(workload=w, queue=q, **base[scenarios[i % 4]]))  # type: ignore[arg-type]
    return out


