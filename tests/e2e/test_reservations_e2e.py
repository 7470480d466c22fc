"""Capacity over time on the real control plane (Kueue TAS on KWOK, the small 2-rack factory):
a Reservation for a 72-GPU job keeps one NVLink clique free while admitting short work before
its start, and the job starts on time; an hourly CapacityPlan lowers the quota in its interval
only (docs/reservations.md).

Time is compressed: the reservation starts ~100 s after it is created (its hold, one hour by
default, has begun), short work runs 25 s (KWOK completes it: ``m2g.io/sim-duration``), and
the plan's "hours" are 60 s intervals.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import Cluster, Obj, condition, unique
from kubernetes.client.exceptions import ApiException
from test_controller_e2e import (
    CHECK,
    POLICIES,
    RACK_LABEL,
    factory_flavor,
    job,
    make_queue,
    running_m2g,
    until,
    workload_of,
)
from test_node_levers_e2e import PIN_RACK, pod_nodes, racks_of

from m2g.model import labels as L
from m2g.planner.config import PlannerConfig

pytestmark = pytest.mark.e2e

CLIQUE_LABEL = "nvidia.com/gpu.clique"


def timed_job(name: str, gpus: int, runtime: int, sim: str | None = None) -> Obj:
    """A rack-pinned job stating its expected runtime (and, for KWOK, how long it runs)."""
    body = job(name, gpus, tier=0)
    meta = body["spec"]["template"]["metadata"]
    meta["annotations"].update({**PIN_RACK, L.EXPECTED_RUNTIME: str(runtime)})
    if sim:
        meta["annotations"]["m2g.io/sim-duration"] = sim
    return body


def create(cluster: Cluster, plural: str, body: Obj) -> str:
    name = body["metadata"]["name"]
    cluster.custom.create_cluster_custom_object("m2g.io", "v1alpha1", plural, body)

    def undo() -> None:
        with contextlib.suppress(ApiException):
            cluster.custom.delete_cluster_custom_object("m2g.io", "v1alpha1", plural, name)
    cluster.cleanup.append(undo)
    return str(name)


def status(cluster: Cluster, name: str) -> dict[str, Any]:
    obj = cluster.custom.get_cluster_custom_object("m2g.io", "v1alpha1", "reservations", name)
    return dict(obj.get("status") or {})


def admitted_at(wl: Obj | None) -> datetime | None:
    cond = condition(wl or {}, "Admitted")
    if not cond or cond["status"] != "True":
        return None
    return datetime.fromisoformat(cond["lastTransitionTime"].replace("Z", "+00:00"))


def t(x: datetime) -> str:
    return x.strftime("%Y-%m-%dT%H:%M:%SZ")


async def test_reservation_keeps_a_clique_free_and_its_job_starts_on_time(
        kubeconfig: Path, cluster: Cluster, namespace: str, tmp_path: Path,
        m2g_crds: None) -> None:
    (tmp_path / "capacity.yaml").write_text(POLICIES["capacity.yaml"])
    make_queue(cluster, namespace, factory_flavor(cluster), 216)
    racks = racks_of(cluster)
    clique_rack = {n.metadata.labels[CLIQUE_LABEL]: n.metadata.labels[RACK_LABEL]
                   for n in cluster.core.list_node(label_selector="m2g.io/factory=small").items}
    cfg = PlannerConfig(check_name=CHECK, reservation_retry_seconds=5, min_shed_seconds=5.0)
    start = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=100)
    name = create(cluster, "reservations", {
        "apiVersion": "m2g.io/v1alpha1", "kind": "Reservation",
        "metadata": {"name": unique("e2e-rsv")},
        "spec": {"start": t(start), "end": t(start + timedelta(minutes=10)), "cliques": 1,
                 "workloads": [{"namespace": namespace, "name": "big"}],
                 "drainLeadSeconds": 30}})
    async with running_m2g(kubeconfig, tmp_path, config=cfg):
        st = await until("the reservation holding a clique", lambda: (
            s := status(cluster, name)).get("phase") == "Holding" and s.get("heldCliques")
            and s, timeout=30)
        held = clique_rack[st["heldCliques"][0]]
        assert st["heldGpus"] == 72 and "keeping 1 clique(s)" in st["message"]
        # short work (25 s, ends well before the start) is admitted, wherever TAS puts it
        cluster.batch.create_namespaced_job(namespace, timed_job("short", 72, 25, "25s"))
        await until("the short job admitted", lambda: admitted_at(
            workload_of(cluster, namespace, "short")), timeout=60)
        # long work and the reserved job itself before its start are held back
        cluster.batch.create_namespaced_job(namespace, timed_job("long", 72, 3600))
        cluster.batch.create_namespaced_job(namespace, timed_job("big", 72, 3600))
        while datetime.now(UTC) < start - timedelta(seconds=3):
            on_held = {n for j in ("long", "big") for n in pod_nodes(cluster, namespace, j)
                       if racks[n] == held}
            assert not on_held, f"{on_held} took the held rack {held} before the start"
            big = workload_of(cluster, namespace, "big")
            assert admitted_at(big) is None, "the reserved job started early"
            await asyncio.sleep(1)
        # at the start the job is admitted on the kept clique
        try:
            got = await until("the reserved job admitted", lambda: admitted_at(
                workload_of(cluster, namespace, "big")), timeout=60)
        except AssertionError:
            for j in ("short", "long", "big"):
                wl = workload_of(cluster, namespace, j) or {}
                print(j, wl.get("spec", {}).get("active"), json.dumps(wl.get("status"))[:3000])
            print(status(cluster, name))
            raise
        late = (got - start).total_seconds()
        print(f"reserved job admitted {late:.1f} s after the reservation's start")
        assert -1 <= late <= 30
        nodes = await until("its pods bound", lambda: len(
            ns := pod_nodes(cluster, namespace, "big")) == 18 and ns, timeout=60)
        assert {racks[n] for n in nodes} == {held}
        st = await until("the status Active", lambda: (
            s := status(cluster, name)).get("phase") == "Active" and s, timeout=30)
        assert any("big" in w for w in st["workloads"])


def quota(cluster: Cluster, cq: str) -> int:
    obj = cluster.custom.get_cluster_custom_object("kueue.x-k8s.io", "v1beta2",
                                                   "clusterqueues", cq)
    for rg in obj["spec"]["resourceGroups"]:
        for f in rg["flavors"]:
            for r in f["resources"]:
                if r["name"] == L.GPU_RESOURCE:
                    return int(r["nominalQuota"])
    raise AssertionError("no GPU quota")


async def test_an_hourly_cap_lowers_quota_in_its_interval_only(
        kubeconfig: Path, cluster: Cluster, namespace: str, tmp_path: Path,
        m2g_crds: None) -> None:
    (tmp_path / "capacity.yaml").write_text(POLICIES["capacity.yaml"])
    cq = make_queue(cluster, namespace, factory_flavor(cluster), 144)
    cfg = PlannerConfig(check_name=CHECK, quota_raise_dwell_seconds=1.0)
    begin = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=40)
    create(cluster, "capacityplans", {
        "apiVersion": "m2g.io/v1alpha1", "kind": "CapacityPlan",
        "metadata": {"name": unique("e2e-cap")},
        "spec": {"start": t(begin), "intervalSeconds": 60, "gpus": [-1, 72, -1]}})
    async with running_m2g(kubeconfig, tmp_path, config=cfg):
        while datetime.now(UTC) < begin + timedelta(seconds=55):
            assert quota(cluster, cq) == 144, "the quota changed outside the capped interval"
            await asyncio.sleep(1)
        await until("the quota capped in the second interval", lambda: quota(cluster, cq) == 72,
                    timeout=20)
        capped_at = datetime.now(UTC)
        assert capped_at < begin + timedelta(seconds=120)
        while datetime.now(UTC) < begin + timedelta(seconds=118):
            assert quota(cluster, cq) == 72, "the quota went back up inside the capped interval"
            await asyncio.sleep(1)
        await until("the quota back after it", lambda: quota(cluster, cq) == 144, timeout=40)
        back = (datetime.now(UTC) - (begin + timedelta(seconds=120))).total_seconds()
        print(f"capped {(capped_at - begin).total_seconds() - 60:.1f} s into its interval; "
              f"restored {back:.1f} s after it ended")
        assert back >= -1
